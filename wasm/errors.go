package wasm

import (
	"errors"
	"fmt"
	"strings"
)

// Classes of failure. Every error returned by this package matches exactly one
// of them with errors.Is, so that callers decide by class, never by message.
var (
	// ErrInvalidModule: the bytes are not a usable module (not WebAssembly, a
	// command module instead of a reactor, an unsupported ABI version, an
	// instantiation that failed).
	ErrInvalidModule = errors.New("invalid module")
	// ErrMissingExport: an export the ABI or the caller requires is absent or
	// has the wrong signature.
	ErrMissingExport = errors.New("missing export")
	// ErrUngrantedImport: the module imports a function it was not granted, or
	// one that does not exist. Refused at load, before any guest code runs.
	ErrUngrantedImport = errors.New("ungranted import")
	// ErrTimeout: the call (or the instantiation) passed its deadline and the
	// guest was stopped.
	ErrTimeout = errors.New("timeout")
	// ErrCanceled: the caller's context was canceled during the call.
	ErrCanceled = errors.New("canceled")
	// ErrMemoryLimit: the guest asked for more linear memory than its limit.
	ErrMemoryLimit = errors.New("memory limit exceeded")
	// ErrTrap: the guest trapped (unreachable, out-of-bounds access, a Go
	// panic, proc_exit, a stack overflow ...).
	ErrTrap = errors.New("trap")
	// ErrBadPointer: the guest handed the host a pointer and length outside
	// its own memory (from alloc, as output, or to a host function).
	ErrBadPointer = errors.New("pointer out of range")
	// ErrBadInput: the caller's input is not what the module takes (an OPA
	// module's must be JSON).
	ErrBadInput = errors.New("bad input")
	// ErrBadOutput: the output is empty or not a JSON object.
	ErrBadOutput = errors.New("bad output")
	// ErrOutputTooLarge: the output is larger than Limits.OutputBytes, or
	// an OPA builtin's argument or result is over its limit (OutputBytes,
	// HostResponseBytes): a sprintf asking for more than the policy may
	// hand back.
	ErrOutputTooLarge = errors.New("output too large")
	// ErrLogFlood: the guest kept logging after its log budget was spent.
	ErrLogFlood = errors.New("log flood")
	// ErrClosed: the module (or engine) was closed.
	ErrClosed = errors.New("closed")
)

// Error is the error type returned by Engine and Module methods. Kind is one
// of the Err* classes above; errors.Is(err, wasm.ErrTimeout) tests it.
type Error struct {
	// Kind is the class, one of the Err* variables.
	Kind error
	// Module is the name given in Spec.Name.
	Module string
	// Op is what was being done: "load", "instantiate", or the export called.
	Op string
	// Detail says what happened, in one line.
	Detail string
	// Guest holds the tail of what the guest wrote to stdout/stderr before it
	// failed (a Go panic message, for instance), if anything.
	Guest string
	// Err is the underlying cause, if any.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Module != "" {
		fmt.Fprintf(&b, "module %q: ", e.Module)
	}
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(e.Kind.Error())
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Guest != "" {
		b.WriteString(" (guest output: ")
		b.WriteString(e.Guest)
		b.WriteString(")")
	}
	return b.String()
}

// Is reports whether target is this error's class.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

func newError(kind error, module, op, detail string, cause error) *Error {
	return &Error{Kind: kind, Module: module, Op: op, Detail: detail, Err: cause}
}

// firstLine trims wazero's multi-line messages (which carry a wasm stack
// trace) to their first line, for messages that end up in pod status.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
