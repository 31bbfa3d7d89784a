//go:build !wasip1

package sdk

import (
	"encoding/json"
	"sync"
)

// Host stands in for the node agent when a policy's code runs natively, in
// its unit tests. Call gets the host function's name ("http_request",
// "tcp_dial", "read_file", "stat_file") and the JSON request, and returns
// the JSON answer (or {"error": "...", "code": "..."}).
type Host interface {
	Call(function string, request []byte) []byte
	Log(level int, msg string)
}

var (
	hostMu sync.Mutex // protects host
	host   Host
)

// SetHost installs h for native runs; nil removes it. It exists only off
// wasip1.
func SetHost(h Host) {
	hostMu.Lock()
	host = h
	hostMu.Unlock()
}

func current() Host {
	hostMu.Lock()
	defer hostMu.Unlock()
	return host
}

func call(fn string, req []byte) []byte {
	h := current()
	if h == nil {
		b, _ := json.Marshal(HostError{Message: "no host: call sdk.SetHost in the test", Code: "denied"})
		return b
	}
	return h.Call(fn, req)
}

func rawLog(level int32, msg string) {
	if h := current(); h != nil {
		h.Log(int(level), msg)
	}
}

func rawHTTPRequest(req []byte) []byte { return call("http_request", req) }
func rawTCPDial(req []byte) []byte     { return call("tcp_dial", req) }
func rawReadFile(req []byte) []byte    { return call("read_file", req) }
func rawStatFile(req []byte) []byte    { return call("stat_file", req) }
