;; deny-escapes: admit denies with a message holding a terminal escape sequence and a newline:
;; {"allowed":false,"message":"\u001b[31mred\u001b[0m\nfake: line"}
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{\"allowed\":false,\"message\":\"\\u001b[31mred\\u001b[0m\\nfake: line\"}")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 64))))
