;; counter: "count" returns {"n":D} where D is the number of calls this
;; instance has served (mod 10), to observe instance reuse; "trap" traps.
(module
  (memory (export "memory") 1)
  (global $calls (mut i32) (i32.const 0))
  (data (i32.const 16) "{\"n\":0}")   ;; 7 bytes at 16; the digit is at 21
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func (export "count") (param i32 i32) (result i64)
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (i32.store8 (i32.const 21) (i32.add (i32.const 48) (i32.rem_u (global.get $calls) (i32.const 10))))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 7)))
  (func (export "trap") (param i32 i32) (result i64) unreachable))
