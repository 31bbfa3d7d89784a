;; forger: an admission policy whose log line and denial carry terminal
;; escape codes and newlines, as a hostile or careless guest could, to test
;; that `holdfast policy test` shows guest text escaped, on its own lines.
(module
  (import "holdfast" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{\"allowed\":false,\"reason\":\"Forged\",\"message\":\"line one\\ndecision:  allowed\\u001b[2K\"}")
  (data (i32.const 256) "\1b[31mred\ndecision:  allowed")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64)
    (call $log (i32.const 2) (i32.const 256) (i32.const 27))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 85))))
