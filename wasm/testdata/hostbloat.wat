;; hostbloat: each export hands the host something as large as its memory,
;; to check that what the host allocates (or the time it spends) for it is
;; bounded by the policy's limits, not by the guest's memory. The memory is
;; declared at its full size, so that no call grows it: what a call costs the
;; host is then the host's own doing.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "holdfast" "log" (func $log (param i32 i32 i32)))
  (import "holdfast" "response_read" (func $read (param i32 i32) (result i32)))
  (import "holdfast" "http_request" (func $http (param i32 i32) (result i32)))
  (memory (export "memory") 720) ;; 45 MiB
  ;; [0, 64): a request's start; [64, 128): output; [128, 256): scratch;
  ;; [1 MiB, 33 MiB): the bulk; [33 MiB, 41 MiB): iovecs; the rest: answers.
  (data (i32.const 0) "{\"url\":\"http://127.0.0.1:9/\",\"body\":\"")  ;; 37 bytes
  (data (i32.const 64) "{\"allowed\":true}")                         ;; 16 bytes
  (global $top (mut i32) (i32.const 0x2900000))
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $top))
    (global.set $top (i32.add (local.get $p) (local.get $n)))
    (local.get $p))
  (func (export "free") (param i32 i32) (global.set $top (i32.const 0x2900000)))
  (func $pack (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32)) (i64.extend_i32_u (local.get $n))))
  (func $ok (result i64) (call $pack (i32.const 64) (i32.const 16)))

  ;; An http_request of 32 MiB: the request's start at 1 MiB - 37, 32 MiB of
  ;; "x" as its body, and its end; the answer is the call's output.
  (func (export "bigrequest") (param i32 i32) (result i64)
    (local $n i32) (local $buf i32)
    (memory.copy (i32.const 0xfffdb) (i32.const 0) (i32.const 37))
    (memory.fill (i32.const 0x100000) (i32.const 0x78) (i32.const 0x2000000))
    (i32.store16 (i32.const 0x2100000) (i32.const 0x7d22)) ;; "}
    (local.set $n (call $http (i32.const 0xfffdb) (i32.const 0x2000027)))
    (local.set $buf (global.get $top))
    (call $pack (local.get $buf) (call $read (local.get $buf) (local.get $n))))

  ;; One fd_write of 32 MiB to stdout.
  (func (export "bigwrite") (param i32 i32) (result i64)
    (i32.store (i32.const 128) (i32.const 0x100000))
    (i32.store (i32.const 132) (i32.const 0x2000000))
    (drop (call $fd_write (i32.const 1) (i32.const 128) (i32.const 1) (i32.const 136)))
    (call $ok))

  ;; One fd_write of a million buffers of 32 MiB each, 32 TiB in all.
  (func $manywrites (export "manywrites") (param i32 i32) (result i64)
    (local $i i32)
    (loop $l
      (i32.store (i32.add (i32.const 0x2100000) (i32.shl (local.get $i) (i32.const 3))) (i32.const 0x100000))
      (i32.store (i32.add (i32.const 0x2100004) (i32.shl (local.get $i) (i32.const 3))) (i32.const 0x2000000))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 0x100000))))
    (drop (call $fd_write (i32.const 1) (i32.const 0x2100000) (i32.const 0x100000) (i32.const 136)))
    (call $ok))

  ;; The same fd_write, 16 times: each is one host call, which the engine's
  ;; checkpoints cannot interrupt.
  (func (export "manywrites16") (param $p i32) (param $n i32) (result i64)
    (local $i i32)
    (drop (call $manywrites (local.get $p) (local.get $n)))
    (loop $l
      (drop (call $fd_write (i32.const 1) (i32.const 0x2100000) (i32.const 0x100000) (i32.const 136)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 15))))
    (call $ok))

  ;; A log line of 32 MiB.
  (func (export "biglog") (param i32 i32) (result i64)
    (call $log (i32.const 1) (i32.const 0x100000) (i32.const 0x2000000))
    (call $ok))

  (func (export "ok") (param i32 i32) (result i64) (call $ok)))
