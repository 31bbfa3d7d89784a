;; command: a command module (exports _start), not a reactor.
(module
  (memory (export "memory") 1)
  (func (export "_start"))
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (i64.const 0)))
