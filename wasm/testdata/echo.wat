;; echo: a well-behaved ABI module in WAT. admit and probe return their
;; input unchanged; the tests send JSON objects.
(module
  (memory (export "memory") 1)
  (global $top (mut i32) (i32.const 1024))
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func $alloc (export "alloc") (param $n i32) (result i32)
    (local $p i32) (local $need i32)
    (local.set $p (global.get $top))
    (global.set $top (i32.add (local.get $p) (local.get $n)))
    (local.set $need (i32.sub (i32.shr_u (i32.add (global.get $top) (i32.const 65535)) (i32.const 16)) (memory.size)))
    (if (i32.gt_s (local.get $need) (i32.const 0))
      (then (if (i32.eq (memory.grow (local.get $need)) (i32.const -1)) (then (return (i32.const 0))))))
    (local.get $p))
  (func (export "free") (param i32 i32) (global.set $top (i32.const 1024)))
  (func $pack (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $n))))
  (func (export "admit") (param $p i32) (param $n i32) (result i64) (call $pack (local.get $p) (local.get $n)))
  (func (export "probe") (param $p i32) (param $n i32) (result i64) (call $pack (local.get $p) (local.get $n))))
