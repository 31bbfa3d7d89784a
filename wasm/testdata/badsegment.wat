;; badsegment: a reactor without _initialize whose data segment lies past its
;; one page of memory, so instantiation fails before any guest code runs.
(module
  (memory (export "memory") 1)
  (data (i32.const 65536) "past the end")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64) (i64.const 0)))
