package sdk

import (
	"encoding/json"
	"testing"
)

func TestEncodeMatchesEncodingJSON(t *testing.T) {
	texts := []string{"", "plain", `quote " and \ backslash`, "<script>&</script>", "tab\tnew\nline\rret\bbs\fff\x00\x1f\x7f",
		"é ünïcödé 😀", "bad \xff utf8 \xc3", "line\u2028para\u2029", `container "app" uses image "evil.io/x"`}
	for _, s := range texts {
		for _, r := range []AdmissionResponse{
			{Allowed: true}, {Allowed: false, Reason: "R", Message: s}, {Allowed: true, Warnings: []string{s, "w2"}},
			{Reason: s, Message: s, Warnings: []string{}},
		} {
			want, _ := json.Marshal(r)
			if got := r.AppendJSON(nil); string(got) != string(want) {
				t.Errorf("%+v:\n got %s\nwant %s", r, got, want)
			}
		}
		for _, r := range []ProbeResponse{{Success: true}, {Message: s}} {
			want, _ := json.Marshal(r)
			if got := r.AppendJSON(nil); string(got) != string(want) {
				t.Errorf("%+v:\n got %s\nwant %s", r, got, want)
			}
		}
	}
}

func FuzzEncodeMatchesEncodingJSON(f *testing.F) {
	f.Add("x", true)
	f.Fuzz(func(t *testing.T, s string, allowed bool) {
		r := AdmissionResponse{Allowed: allowed, Message: s, Warnings: []string{s}}
		want, _ := json.Marshal(r)
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("%q:\n got %s\nwant %s", s, got, want)
		}
	})
}
