;; noexport: follows the ABI but has no admit (or probe) entry point.
(module
  (memory (export "memory") 1)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32)))
