;; hostile: one export per misbehaviour. Each must fail only its own call
;; with a classified error, and leave the engine and other modules healthy.
(module
  (import "holdfast" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (global $top (mut i32) (i32.const 1024))
  (data (i32.const 16) "{\"allowed\":true}")   ;; 16 bytes at 16
  (data (i32.const 64) "not json at all")      ;; 15 bytes at 64
  (data (i32.const 96) "spam")                 ;; 4 bytes at 96
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func $alloc (export "alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $top))
    (global.set $top (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "free") (param i32 i32) (global.set $top (i32.const 1024)))
  (func $pack (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $n))))

  ;; a well-behaved entry, to show the instance that replaced a broken one works
  (func (export "ok") (param i32 i32) (result i64) (call $pack (i32.const 16) (i32.const 16)))
  ;; spins forever: stopped by the deadline
  (func (export "loop") (param i32 i32) (result i64) (loop $l (br $l)) (i64.const 0))
  ;; grows memory until refused, then traps
  (func (export "membomb") (param i32 i32) (result i64)
    (loop $l
      (if (i32.ne (memory.grow (i32.const 16)) (i32.const -1)) (then (br $l))))
    unreachable)
  ;; traps
  (func (export "trap") (param i32 i32) (result i64) unreachable)
  ;; divides by zero
  (func (export "divzero") (param i32 i32) (result i64) (i64.div_s (i64.const 1) (i64.const 0)))
  ;; returns a pointer far outside its 64 KiB memory
  (func (export "badptr") (param i32 i32) (result i64) (call $pack (i32.const 0x7ffffff0) (i32.const 100)))
  ;; returns a pointer whose end wraps past 4 GiB
  (func (export "wrapptr") (param i32 i32) (result i64) (call $pack (i32.const 0xfffffff0) (i32.const 0x20)))
  ;; returns 4 MiB of output (zeros), over the 64 KiB limit
  (func (export "oversized") (param i32 i32) (result i64)
    (drop (memory.grow (i32.const 64)))
    (call $pack (i32.const 0) (i32.const 0x400000)))
  ;; returns something that is not JSON
  (func (export "notjson") (param i32 i32) (result i64) (call $pack (i32.const 64) (i32.const 15)))
  ;; returns nothing
  (func (export "empty") (param i32 i32) (result i64) (i64.const 0))
  ;; logs forever
  (func (export "logflood") (param i32 i32) (result i64)
    (loop $l (call $log (i32.const 1) (i32.const 96) (i32.const 4)) (br $l))
    (i64.const 0))
  ;; hands the host a pointer outside its memory
  (func (export "hostbadptr") (param i32 i32) (result i64)
    (call $log (i32.const 1) (i32.const 0x7ffffff0) (i32.const 100))
    (call $pack (i32.const 16) (i32.const 16)))
  ;; recurses until the stack overflows
  (func $deep (export "stackoverflow") (param i32 i32) (result i64)
    (call $deep (local.get 0) (local.get 1)))
  ;; recurses with 24 values pending on the operand stack and 8 locals in
  ;; each frame: frames larger than their locals alone suggest
  (func $wide (export "stackoverflowwide") (param i32 i32) (result i64)
    (local i64 i64 i64 i64 i64 i64 i64 i64)
    (i64.add (i64.mul (local.get 9) (i64.const 26)) (i64.add (i64.mul (local.get 8) (i64.const 25)) (i64.add (i64.mul (local.get 7) (i64.const 24)) (i64.add (i64.mul (local.get 6) (i64.const 23)) (i64.add (i64.mul (local.get 5) (i64.const 22)) (i64.add (i64.mul (local.get 4) (i64.const 21)) (i64.add (i64.mul (local.get 3) (i64.const 20)) (i64.add (i64.mul (local.get 2) (i64.const 19)) (i64.add (i64.mul (local.get 9) (i64.const 18)) (i64.add (i64.mul (local.get 8) (i64.const 17)) (i64.add (i64.mul (local.get 7) (i64.const 16)) (i64.add (i64.mul (local.get 6) (i64.const 15)) (i64.add (i64.mul (local.get 5) (i64.const 14)) (i64.add (i64.mul (local.get 4) (i64.const 13)) (i64.add (i64.mul (local.get 3) (i64.const 12)) (i64.add (i64.mul (local.get 2) (i64.const 11)) (i64.add (i64.mul (local.get 9) (i64.const 10)) (i64.add (i64.mul (local.get 8) (i64.const 9)) (i64.add (i64.mul (local.get 7) (i64.const 8)) (i64.add (i64.mul (local.get 6) (i64.const 7)) (i64.add (i64.mul (local.get 5) (i64.const 6)) (i64.add (i64.mul (local.get 4) (i64.const 5)) (i64.add (i64.mul (local.get 3) (i64.const 4)) (i64.add (i64.mul (local.get 2) (i64.const 3)) (call $wide (local.get 0) (local.get 1))))))))))))))))))))))))))))
