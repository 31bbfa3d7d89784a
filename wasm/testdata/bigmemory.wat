;; bigmemory: asks for 2048 pages (128 MiB) up front, over the default limit.
(module
  (memory (export "memory") 2048)
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (i64.const 0)))
