// Command gohostile is a Go policy that misbehaves on request, to test what
// the Go runtime does inside the sandbox: settings {"do": "..."}.
package main

import (
	"os"
	"time"

	sdk "github.com/holdfast-dev/holdfast/policies/sdk/go"
	"github.com/holdfast-dev/holdfast/policies/sdk/go/admission"
)

type settings struct {
	Do string `json:"do"`
	N  int    `json:"n"`
}

var keep [][]byte

func init() { admission.Handle(handle) }

func main() {}

func handle(req *sdk.AdmissionRequest) sdk.AdmissionResponse {
	var s settings
	if err := sdk.DecodeSettings(req.Settings, &s); err != nil {
		return admission.Deny("InvalidSettings", err.Error())
	}
	switch s.Do {
	case "panic":
		panic("policy bug: index out of range")
	case "membomb":
		for {
			keep = append(keep, make([]byte, 1<<20))
			keep[len(keep)-1][0] = 1
		}
	case "loop":
		n := 0
		for {
			n++
		}
	case "sleep":
		time.Sleep(time.Hour)
	case "env":
		// The sandbox has no environment and no files.
		_, err := os.ReadFile("/etc/passwd")
		return admission.Deny("Probe", "env="+os.Getenv("HOME")+" passwdErr="+errString(err))
	case "time":
		return admission.Deny("Probe", time.Now().UTC().Format(time.RFC3339))
	case "log":
		for i := 0; i < s.N; i++ {
			sdk.Logf("line %d", i)
		}
	}
	return admission.Allow()
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
