;; growrefused: admit asks memory.grow for 2048 pages (128 MiB, past the
;; default 64 MiB limit) and answers with what memory.grow returned, which
;; the ABI says is -1, not a failed call.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{\"grow\":-1}")
  (data (i32.const 32) "{\"grow\":\"not -1\"}")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "admit") (param i32 i32) (result i64)
    (if (result i64) (i32.eq (memory.grow (i32.const 2048)) (i32.const -1))
      (then (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 11)))
      (else (i64.or (i64.shl (i64.const 32) (i64.const 32)) (i64.const 17))))))
