;; shortread: admit passes its input to http_request as the request, reads
;; the answer with response_read into a 10-byte buffer, then again into a
;; large one, and answers {"n":"NNN","k1":"NNN","k2":"NNN"}: the answer's
;; length and what each response_read returned.
(module
  (import "holdfast" "http_request" (func $http (param i32 i32) (result i32)))
  (import "holdfast" "response_read" (func $read (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 512) "{\"n\":\"000\",\"k1\":\"000\",\"k2\":\"000\"}")
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "free") (param i32 i32))
  ;; put3 writes v (< 1000) as three decimal digits at p.
  (func $put3 (param $p i32) (param $v i32)
    (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.div_u (local.get $v) (i32.const 100))))
    (i32.store8 (i32.add (local.get $p) (i32.const 1)) (i32.add (i32.const 48) (i32.rem_u (i32.div_u (local.get $v) (i32.const 10)) (i32.const 10))))
    (i32.store8 (i32.add (local.get $p) (i32.const 2)) (i32.add (i32.const 48) (i32.rem_u (local.get $v) (i32.const 10)))))
  (func (export "admit") (param $p i32) (param $n i32) (result i64)
    (call $put3 (i32.const 518) (call $http (local.get $p) (local.get $n)))
    (call $put3 (i32.const 529) (call $read (i32.const 1024) (i32.const 10)))
    (call $put3 (i32.const 540) (call $read (i32.const 2048) (i32.const 1000)))
    (i64.or (i64.shl (i64.const 512) (i64.const 32)) (i64.const 33))))
