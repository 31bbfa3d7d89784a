// Package wasm runs untrusted WebAssembly modules for holdfast, sandboxed
// with wazero. It knows nothing of pods, containerd or client-go: it loads a
// module, checks it against holdfast's ABI (policies/ABI.md) and its
// grants, and calls its entry points with JSON in and JSON out.
//
//	eng, err := wasm.NewEngine(ctx, wasm.NewConfig().WithCacheDir(dir))
//	mod, err := eng.Load(ctx, wasm.Spec{Name: "allowed-registries", Wasm: b, Entrypoints: []string{"admit"}})
//	out, err := mod.Call(ctx, "admit", inputJSON)
//
// What a guest gets, and what it does not:
//
//   - Nothing by default. WASI is provided for the languages whose runtime
//     needs it, with no preopened directory, no environment, no arguments,
//     no sockets, an empty stdin, stdout/stderr captured (their tail explains
//     a failure, they never reach the agent's log), a deterministic random
//     source and a fake clock.
//   - Host functions under the import module "holdfast", each only with its
//     grant: log (every module, rate-limited), http_request and tcp_dial
//     (GrantHTTP, GrantTCP) to the targets of the call (WithNetwork),
//     read_file and stat_file (GrantFile) under the prefixes and mounts of
//     the call (WithFiles), and the real clock (GrantClock). A module that
//     imports anything else, or a function it was not granted, is refused by
//     Load with ErrUngrantedImport before any of its code runs.
//   - Budgets. Every call has a deadline (Limits.CallTimeout and the
//     context's), checked at checkpoints the engine inserts into every
//     module (at function entries and loop iterations), so a looping guest
//     is stopped; linear memory is capped per instance; output
//     and host answers are capped; log lines are rate-limited and a guest
//     that keeps flooding fails its call.
//   - What the host allocates on a guest's behalf is charged to the
//     policy's limits, never to the guest's memory size: what the guest
//     hands over (a host function's request, an OPA builtin's argument) is
//     at most Limits.OutputBytes, what the host hands back (an answer, a
//     builtin's result such as sprintf's) at most Limits.HostResponseBytes
//     as JSON, a log line Limits.LogLineBytes, the kept tail of
//     stdout/stderr 2 KiB. A host call costs the agent's heap a small
//     multiple of these (policies/ABI.md gives the bound), and returns by
//     the call's deadline even when the kernel does not answer (a file on a
//     hung file system: "timeout").
//
// Modules of Open Policy Agent's Wasm ABI (what `opa build -t wasm` writes)
// load with Spec.ABI = ABIOPA and Spec.Data, their data document; a call's
// export is an OPA entrypoint and its output OPA's result set (opa.go). They
// get the same budgets, and only OPA's env.opa_* host functions: the memory
// they import is defined inside the module, so that each instance has its
// own under its limit, and of the builtins OPA leaves to the host only
// sprintf is provided (opabuiltins.go); a module that needs another is
// refused at Load, naming it.
//
// Modules are compiled once (and cached on disk with Config.WithCacheDir);
// instances are pooled and reused across calls, never instantiated per
// call. A call that fails in any way discards its instance, which is
// replaced in the background: one bad call never poisons the next, nor
// another module. Errors are *Error values of a class tested with
// errors.Is: ErrTimeout, ErrMemoryLimit, ErrTrap, ErrBadPointer,
// ErrBadInput, ErrBadOutput, ErrOutputTooLarge, ErrLogFlood, ErrMissingExport,
// ErrUngrantedImport, ErrInvalidModule, ErrCanceled, ErrClosed.
//
// RATIONALE.md records why the package is built this way.
package wasm
