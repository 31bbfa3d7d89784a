;; shapes: module shapes the engine's rewrite must keep working: no imports,
;; no globals and no type section entries of its own for the helpers; a start
;; function; a table filled by element segments (function indices and
;; expressions, passive and declarative), called indirectly; a declared
;; funcref global; a block typed by a type index with parameters; br_table;
;; typed select; bulk memory. admit answers {"ok":true} only if every part
;; computed what it should.
(module
  (type $binop (func (param i32 i32) (result i32)))
  (type $pair (func (param i32) (result i32 i32)))
  (memory (export "memory") 1)
  (table $t 4 funcref)
  (global $fref funcref (ref.func $mul))
  (global $started (mut i32) (i32.const 0))
  (data (i32.const 16) "{\22ok\22:true}")
  (data $passive "xyz")
  (elem (i32.const 0) $add $mul)
  (elem (table $t) (i32.const 2) funcref (ref.func $sub) (ref.null func))
  (elem $later funcref (ref.func $add))
  (elem declare func $mul)
  (start $start)
  (func $start (global.set $started (i32.const 7)))
  (func (export "holdfast_abi_version") (result i32) (i32.const 1))
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "free") (param i32 i32))
  (func $add (type $binop) (i32.add (local.get 0) (local.get 1)))
  (func $mul (type $binop) (i32.mul (local.get 0) (local.get 1)))
  (func $sub (type $binop) (i32.sub (local.get 0) (local.get 1)))
  (func $dup (type $pair) (local.get 0) (local.get 0))
  (func $pick (param i32) (result i32)
    (block $c (block $b (block $a (br_table $a $b $c (local.get 0)))
        (return (i32.const 10)))
      (return (i32.const 20)))
    (i32.const 30))
  (func (export "admit") (param i32 i32) (result i64)
    (local $v i32)
    ;; 2+3=5, 5*4=20, 20-6=14 through the table
    (local.set $v (call_indirect (type $binop) (i32.const 2) (i32.const 3) (i32.const 0)))
    (local.set $v (call_indirect (type $binop) (local.get $v) (i32.const 4) (i32.const 1)))
    (local.set $v (call_indirect (type $binop) (local.get $v) (i32.const 6) (i32.const 2)))
    ;; a block with parameters: (14, 14) -> 28
    (call $dup (local.get $v))
    (block (type $binop) (i32.add))
    (local.set $v)
    ;; br_table: 10 + 20 + 30 = 60 -> 88
    (local.set $v (i32.add (local.get $v)
      (i32.add (call $pick (i32.const 0)) (i32.add (call $pick (i32.const 1)) (call $pick (i32.const 5))))))
    ;; typed select and the start function: 88 + 7 = 95
    (local.set $v (i32.add (local.get $v) (select (result i32) (global.get $started) (i32.const 0) (i32.const 1))))
    ;; bulk memory: copy "xyz" and check the first byte ('x' = 120): 95 + 120 = 215
    (memory.init $passive (i32.const 64) (i32.const 0) (i32.const 3))
    (local.set $v (i32.add (local.get $v) (i32.load8_u (i32.const 64))))
    ;; the funcref global is the table's $mul
    (if (i32.eqz (ref.is_null (global.get $fref))) (then (local.set $v (i32.add (local.get $v) (i32.const 1)))))
    (if (i32.ne (local.get $v) (i32.const 216)) (then (unreachable)))
    (i64.const 0x100000000b)))
