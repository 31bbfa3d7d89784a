package wasm

import (
	"fmt"
	"slices"
	"strings"
)

// Grant names a capability a module may be given. A module gets nothing but
// GrantLog unless its Spec lists the grant.
type Grant string

const (
	// GrantLog allows holdfast.log. Every module has it.
	GrantLog Grant = "log"
	// GrantHTTP allows holdfast.http_request to the targets of the call
	// (see WithNetwork).
	GrantHTTP Grant = "http"
	// GrantTCP allows holdfast.tcp_dial to the targets of the call.
	GrantTCP Grant = "tcp"
	// GrantFile allows holdfast.read_file and holdfast.stat_file under the
	// prefixes and mounts of the call (see WithFiles).
	GrantFile Grant = "file"
	// GrantClock gives the guest the real wall and monotonic clocks instead
	// of wazero's deterministic fake ones.
	GrantClock Grant = "clock"
)

// AllGrants lists every grant, for validation and documentation.
var AllGrants = []Grant{GrantLog, GrantHTTP, GrantTCP, GrantFile, GrantClock}

// ParseGrant checks a grant name.
func ParseGrant(s string) (Grant, error) {
	g := Grant(strings.ToLower(strings.TrimSpace(s)))
	if slices.Contains(AllGrants, g) {
		return g, nil
	}
	return "", fmt.Errorf("unknown grant %q (known: log, http, tcp, file, clock)", s)
}

// HostModule is the import module name of holdfast's host functions.
const HostModule = "holdfast"

// wasiModule is the only other import module a guest may use. It is always
// provided, sandboxed: no preopened directories, no environment, no
// arguments, no sockets, stdin empty, stdout/stderr captured, a fake clock
// unless GrantClock, a deterministic random source.
const wasiModule = "wasi_snapshot_preview1"

// hostFunctionGrants maps each host function to the grant it needs.
var hostFunctionGrants = map[string]Grant{
	"log":           GrantLog,
	"response_read": GrantLog, // plumbing for the other calls; harmless alone
	"http_request":  GrantHTTP,
	"tcp_dial":      GrantTCP,
	"read_file":     GrantFile,
	"stat_file":     GrantFile,
}

type grantSet map[Grant]bool

func newGrantSet(gs []Grant) (grantSet, error) {
	s := grantSet{GrantLog: true}
	for _, g := range gs {
		if !slices.Contains(AllGrants, g) {
			return nil, fmt.Errorf("unknown grant %q", g)
		}
		s[g] = true
	}
	return s, nil
}

// checkImport decides whether a module may import module.name.
func (s grantSet) checkImport(module, name string) error {
	switch module {
	case wasiModule:
		return nil
	case HostModule:
		g, ok := hostFunctionGrants[name]
		if !ok {
			return fmt.Errorf("imports %s.%s, which holdfast does not provide (see policies/ABI.md for the host functions)", module, name)
		}
		if !s[g] {
			return fmt.Errorf("imports %s.%s, which needs the %q grant; add it to the policy's grants or remove the import", module, name, g)
		}
		return nil
	default:
		return fmt.Errorf("imports %s.%s; only %s and %s imports are provided", module, name, HostModule, wasiModule)
	}
}
