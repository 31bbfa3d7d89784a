package sdk

import (
	"encoding/json"
	"fmt"

	"github.com/holdfast-dev/holdfast/policies/abi"
)

// Log levels for Log.
const (
	LevelDebug = 0
	LevelInfo  = 1
	LevelWarn  = 2
	LevelError = 3
)

// Log writes a line to the node agent's log, tagged with the policy. Every
// policy may log; the host drops lines over the policy's rate budget, and
// fails the call of a policy that keeps flooding.
func Log(level int, msg string) { rawLog(int32(level), msg) }

// Logf formats and logs at LevelInfo.
func Logf(format string, args ...any) { rawLog(LevelInfo, fmt.Sprintf(format, args...)) }

// HostError is a host function's refusal or failure.
type HostError struct {
	Message string `json:"error"`
	// Code is "denied" (not granted, or not a target of this call),
	// "invalid", "not_found", "timeout" or "io".
	Code string `json:"code"`
}

func (e *HostError) Error() string { return e.Code + ": " + e.Message }

// HTTPRequest asks the host for an HTTP request. It needs the "http" grant,
// and the URL must name the pod's IP and one of its allowed ports.
type HTTPRequest = abi.HTTPRequest

// HTTPResponse is the host's answer to HTTPRequest.
type HTTPResponse = abi.HTTPResponse

// TCPRequest asks the host to connect, send, read and close. It needs the
// "tcp" grant, and Address ("ip:port") must be an allowed target.
type TCPRequest = abi.TCPRequest

// TCPResponse is the host's answer to TCPDial.
type TCPResponse = abi.TCPResponse

// FileContent is the host's answer to ReadFile.
type FileContent = abi.FileContent

// FileStat is the host's answer to StatFile.
type FileStat = abi.FileStat

// HTTP performs req through the host.
func HTTP(req HTTPRequest) (*HTTPResponse, error) {
	return exchange[HTTPResponse](rawHTTPRequest, req)
}

// TCPDial connects to req.Address through the host.
func TCPDial(req TCPRequest) (*TCPResponse, error) {
	return exchange[TCPResponse](rawTCPDial, req)
}

// ReadFile reads up to maxBytes (0: the host's cap) of a file inside the
// container, under a prefix the policy's "file" grant allows.
func ReadFile(path string, maxBytes int) (*FileContent, error) {
	return exchange[FileContent](rawReadFile, abi.FileRequest{Path: path, MaxBytes: maxBytes})
}

// StatFile returns a file's size and modification time, under the same rules
// as ReadFile.
func StatFile(path string) (*FileStat, error) {
	return exchange[FileStat](rawStatFile, abi.FileRequest{Path: path})
}

func exchange[T any](raw func([]byte) []byte, req any) (*T, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	answer := raw(b)
	var he HostError
	if err := json.Unmarshal(answer, &he); err == nil && he.Code != "" {
		return nil, &he
	}
	var out T
	if err := json.Unmarshal(answer, &out); err != nil {
		return nil, fmt.Errorf("decode host answer: %w", err)
	}
	return &out, nil
}
