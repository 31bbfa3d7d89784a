//go:build !wasip1

package main

import (
	"encoding/json"
	"strings"
	"testing"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/probe"
)

type fakeHost struct {
	status int
	body   string
	url    string
}

func (h *fakeHost) Call(fn string, req []byte) []byte {
	var r sdk.HTTPRequest
	_ = json.Unmarshal(req, &r)
	h.url = r.URL
	b, _ := json.Marshal(sdk.HTTPResponse{Status: h.status, Body: h.body})
	return b
}
func (h *fakeHost) Log(int, string) {}

func TestCheck(t *testing.T) {
	cases := []struct {
		name    string
		status  int
		body    string
		success bool
	}{
		{"equal", 200, `{"checks":{"db":{"status":"ok"}}}`, true},
		{"different", 200, `{"checks":{"db":{"status":"down"}}}`, false},
		{"missing", 200, `{"checks":{}}`, false},
		{"server error", 503, `{"checks":{"db":{"status":"ok"}}}`, false},
		{"not json", 200, `<html>`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHost{status: tc.status, body: tc.body}
			sdk.SetHost(h)
			defer sdk.SetHost(nil)
			in := []byte(`{"container":"app","podIP":"10.88.0.7","ports":[8080],"settings":{"port":8080,"path":"healthz","field":"checks.db.status","equals":"ok"}}`)
			out, err := probe.Evaluate(in)
			if err != nil {
				t.Fatal(err)
			}
			var resp sdk.ProbeResponse
			_ = json.Unmarshal(out, &resp)
			if resp.Success != tc.success {
				t.Fatalf("success = %v, want %v (%s)", resp.Success, tc.success, resp.Message)
			}
			if !strings.HasPrefix(h.url, "http://10.88.0.7:8080/healthz") {
				t.Fatalf("url = %q", h.url)
			}
		})
	}
}
