// Command tcp-request-response is a holdfast probe policy: it connects to a
// port of the pod, sends a request, and succeeds when the answer contains an
// expected string. Grants: tcp.
//
// Settings:
//
//	port: 6379
//	send: "PING\r\n"     # optional
//	expect: "+PONG"      # required substring of the answer
//	readBytes: 256       # default 1024
//	timeoutMillis: 500   # default: the probe's deadline
package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/probe"
)

type settings struct {
	Port          int    `json:"port"`
	Send          string `json:"send"`
	Expect        string `json:"expect"`
	ReadBytes     int    `json:"readBytes"`
	TimeoutMillis int    `json:"timeoutMillis"`
}

func init() { probe.Handle(check) }

func main() {}

func check(req *sdk.ProbeRequest) sdk.ProbeResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return probe.Failure("tcp-request-response: settings: " + err.Error())
	}
	if s.Port == 0 || s.Expect == "" {
		return probe.Failure("tcp-request-response: settings need port and expect")
	}
	if s.ReadBytes == 0 {
		s.ReadBytes = 1024
	}
	addr := net.JoinHostPort(req.PodIP, strconv.Itoa(s.Port))
	resp, err := sdk.TCPDial(sdk.TCPRequest{Address: addr, Send: s.Send, ReadBytes: s.ReadBytes, ReadUntil: s.Expect, TimeoutMillis: s.TimeoutMillis})
	if err != nil {
		return probe.Failure(fmt.Sprintf("dial %s: %v", addr, err))
	}
	if !strings.Contains(resp.Received, s.Expect) {
		msg := fmt.Sprintf("%s answered %.64q, want it to contain %q", addr, resp.Received, s.Expect)
		if resp.Error != "" {
			msg += " (" + resp.Error + ")"
		}
		return probe.Failure(msg)
	}
	return probe.Success(fmt.Sprintf("%s answered %q", addr, s.Expect))
}
