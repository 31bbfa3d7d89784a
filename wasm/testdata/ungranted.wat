;; ungranted: imports http_request; loaded without the "http" grant it must
;; be refused before any of its code runs.
(module
  (import "holdfast" "http_request" (func $http (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (i64.const 0)))
