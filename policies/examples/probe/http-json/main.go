// Command http-json is a holdfast probe policy: it GETs a JSON document from
// the pod and succeeds when a field equals an expected value. Grants: http.
//
// Settings:
//
//	port: 8080               # must be among the ports the host allows
//	path: /healthz           # default "/"
//	scheme: http             # or https (certificates are not verified)
//	field: checks.db.status  # dot-separated path into the JSON document
//	equals: "ok"             # any JSON value
//	expectStatus: 200        # default: any 2xx
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/probe"
)

type settings struct {
	Port         int             `json:"port"`
	Path         string          `json:"path"`
	Scheme       string          `json:"scheme"`
	Field        string          `json:"field"`
	Equals       json.RawMessage `json:"equals"`
	ExpectStatus int             `json:"expectStatus"`
}

func init() { probe.Handle(check) }

func main() {}

func check(req *sdk.ProbeRequest) sdk.ProbeResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return probe.Failure("http-json: settings: " + err.Error())
	}
	if s.Port == 0 || s.Field == "" || len(s.Equals) == 0 {
		return probe.Failure("http-json: settings need port, field and equals")
	}
	scheme := s.Scheme
	if scheme == "" {
		scheme = "http"
	}
	path := s.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(req.PodIP, strconv.Itoa(s.Port)), path)
	resp, err := sdk.HTTP(sdk.HTTPRequest{URL: url, Headers: map[string]string{"Accept": "application/json"}})
	if err != nil {
		return probe.Failure(fmt.Sprintf("GET %s: %v", url, err))
	}
	if s.ExpectStatus != 0 && resp.Status != s.ExpectStatus || s.ExpectStatus == 0 && (resp.Status < 200 || resp.Status > 299) {
		return probe.Failure(fmt.Sprintf("GET %s: status %d", url, resp.Status))
	}
	var doc any
	if err := json.Unmarshal([]byte(resp.Body), &doc); err != nil {
		return probe.Failure(fmt.Sprintf("GET %s: body is not JSON: %v", url, err))
	}
	got, ok := lookup(doc, s.Field)
	if !ok {
		return probe.Failure(fmt.Sprintf("field %s is missing", s.Field))
	}
	var want any
	if err := json.Unmarshal(s.Equals, &want); err != nil {
		return probe.Failure("http-json: settings.equals: " + err.Error())
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		return probe.Failure(fmt.Sprintf("field %s is %s, want %s", s.Field, g, s.Equals))
	}
	return probe.Success(fmt.Sprintf("field %s is %s", s.Field, s.Equals))
}

// lookup follows a dot-separated path through objects (and array indexes).
func lookup(doc any, path string) (any, bool) {
	cur := doc
	for _, part := range strings.Split(path, ".") {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[part]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}
