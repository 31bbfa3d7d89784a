package logs

import (
	"strings"
	"testing"
)

// A pod log directory name fits a file name (255 bytes) whatever the pod name the API allowed;
// namespace and UID stay whole, and the kubelet's name is unchanged when it fits.
func TestPodDirName(t *testing.T) {
	const uid = "ce904fac-70b1-490f-9bca-0fa18a6f8780"
	if got := PodDirName("default", "web", uid); got != "default_web_"+uid {
		t.Errorf("short name: %q", got)
	}
	ns := strings.Repeat("n", 63)
	for _, name := range []string{strings.Repeat("p", 253), strings.Repeat("p", 153), strings.Repeat("p", 154)} {
		got := PodDirName(ns, name, uid)
		if len(got) > 255 {
			t.Errorf("%d-character name: %d bytes", len(name), len(got))
		}
		if !strings.HasPrefix(got, ns+"_p") || !strings.HasSuffix(got, "_"+uid) {
			t.Errorf("%d-character name: %q lost its namespace or UID", len(name), got)
		}
		if fits := len(ns)+len(name)+len(uid)+2 <= 255; fits != (got == ns+"_"+name+"_"+uid) {
			t.Errorf("%d-character name: %q (cut when it fits, or kept when it does not)", len(name), got)
		}
	}
}
