// Package abi holds the JSON messages of the host functions a policy may call
// (policies/ABI.md). The host (wasm/) and the Go SDK (policies/sdk/go) both use
// these types, so the two sides of the ABI cannot drift apart. No imports: it
// compiles into policies (GOOS=wasip1) as well as into the agent.
package abi

// HTTPRequest is the request of holdfast.http_request.
type HTTPRequest struct {
	// Method defaults to GET.
	Method string `json:"method,omitempty"`
	// URL must be http or https to an allowed IP and port.
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	// MaxBodyBytes caps the response body; the host's cap
	// (wasm.Limits.HostResponseBytes) applies anyway.
	MaxBodyBytes int `json:"maxBodyBytes,omitempty"`
}

// HTTPResponse is the answer of holdfast.http_request (or a host error).
type HTTPResponse struct {
	Status    int                 `json:"status"`
	Headers   map[string][]string `json:"headers,omitempty"`
	Body      string              `json:"body"`
	Truncated bool                `json:"truncated,omitempty"`
}

// TCPRequest is the request of holdfast.tcp_dial: connect, send, read, close.
type TCPRequest struct {
	// Address is "ip:port", an allowed target.
	Address string `json:"address"`
	// Send is written after connecting, if not empty.
	Send string `json:"send,omitempty"`
	// ReadBytes stops reading after this many bytes. 0 reads nothing: the
	// answer only says whether the connection was made. Capped by the host.
	ReadBytes int `json:"readBytes,omitempty"`
	// ReadUntil stops reading once this string has been received.
	ReadUntil string `json:"readUntil,omitempty"`
	// TimeoutMillis bounds connect+send+read; the call's deadline applies
	// anyway.
	TimeoutMillis int `json:"timeoutMillis,omitempty"`
}

// TCPResponse is the answer of holdfast.tcp_dial (or a host error).
type TCPResponse struct {
	Connected bool   `json:"connected"`
	Received  string `json:"received"`
	// Error is set if reading stopped on an error other than the peer closing
	// or ReadBytes/ReadUntil being reached (a timeout, a reset).
	Error string `json:"error,omitempty"`
	// Truncated is set if Received was cut to fit the host's answer limit.
	Truncated bool `json:"truncated,omitempty"`
}

// FileRequest is the request of holdfast.read_file and holdfast.stat_file.
type FileRequest struct {
	Path string `json:"path"`
	// MaxBytes caps what read_file returns; the host's cap applies anyway.
	MaxBytes int `json:"maxBytes,omitempty"`
}

// FileContent is the answer of holdfast.read_file.
type FileContent struct {
	Data      string `json:"data"`
	Size      int64  `json:"size"`
	Truncated bool   `json:"truncated,omitempty"`
}

// FileStat is the answer of holdfast.stat_file.
type FileStat struct {
	Size            int64  `json:"size"`
	ModTimeUnixNano int64  `json:"modTimeUnixNano"`
	Mode            string `json:"mode"`
	IsDir           bool   `json:"isDir"`
}
