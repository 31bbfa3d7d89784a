;; probe-fail: probe always answers {"success":false,"message":"db down"}
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{\"success\":false,\"message\":\"db down\"}")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "free") (param i32 i32))
  (func (export "probe") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 37))))
