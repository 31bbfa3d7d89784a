// Command heartbeat-file is a holdfast probe policy: it succeeds when a file
// inside the container was modified less than maxAgeSeconds ago, the
// classic liveness signal of a worker that touches a file in its loop.
// Grants: file (with a prefix covering the path) and clock (without the
// real clock the guest's time is a fake one and the age meaningless).
//
// Settings:
//
//	path: /tmp/heartbeat
//	maxAgeSeconds: 30
package main

import (
	"fmt"
	"time"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/probe"
)

type settings struct {
	Path          string `json:"path"`
	MaxAgeSeconds int    `json:"maxAgeSeconds"`
}

// fakeClockBefore: wazero's deterministic clock starts at 2022-01-01; a
// real clock is later than this.
var fakeClockBefore = time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)

func init() { probe.Handle(check) }

func main() {}

func check(req *sdk.ProbeRequest) sdk.ProbeResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return probe.Failure("heartbeat-file: settings: " + err.Error())
	}
	if s.Path == "" || s.MaxAgeSeconds <= 0 {
		return probe.Failure("heartbeat-file: settings need path and maxAgeSeconds > 0")
	}
	now := time.Now()
	if now.Before(fakeClockBefore) {
		return probe.Failure("heartbeat-file: the policy has no real clock; grant it \"clock\"")
	}
	st, err := sdk.StatFile(s.Path)
	if err != nil {
		return probe.Failure(fmt.Sprintf("%s: %v", s.Path, err))
	}
	age := now.Sub(time.Unix(0, st.ModTimeUnixNano))
	maxAge := time.Duration(s.MaxAgeSeconds) * time.Second
	if age > maxAge {
		return probe.Failure(fmt.Sprintf("%s was last modified %s ago, more than %s", s.Path, age.Round(time.Second), maxAge))
	}
	return probe.Success(fmt.Sprintf("%s modified %s ago", s.Path, age.Round(time.Millisecond)))
}
