;; exits: a function with two results leaves by every way there is (return in a
;; nested block, br_if and br to the function's label, the end of its body),
;; called 400000 times in one call. The engine's rewrite must keep the results
;; and give the stack budget back on each way out, or the call runs out of
;; stack.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{\22ok\22:true}")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func $exits (param i32) (result i32 i64)
    (block
      (loop
        (if (i32.eqz (local.get 0)) (then (return (i32.const 1) (i64.const 2))))))
    (br_if 0 (i32.const 3) (i64.const 4) (i32.eq (local.get 0) (i32.const 1)))
    (drop)
    (drop)
    (if (i32.eq (local.get 0) (i32.const 2))
      (then (br 1 (i32.const 5) (i64.const 6))))
    (i32.const 7)
    (i64.const 8))
  (func (export "admit") (param i32 i32) (result i64)
    (local $i i32) (local $a i32) (local $sum i64) (local $r i64)
    (loop $l
      (call $exits (i32.rem_u (local.get $i) (i32.const 4)))
      (local.set $r)
      (local.set $a)
      (local.set $sum (i64.add (local.get $sum) (i64.add (local.get $r) (i64.extend_i32_u (local.get $a)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 400000))))
    (if (i64.ne (local.get $sum) (i64.const 3600000)) (then (unreachable)))
    (i64.const 0x100000000b)))
