;; trap: admit and probe trap
(module
  (memory (export "memory") 1)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) unreachable)
  (func (export "probe") (param i32 i32) (result i64) unreachable))
