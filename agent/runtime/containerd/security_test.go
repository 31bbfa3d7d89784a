package containerd

import (
	"testing"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// On a host that enforces AppArmor, a container with no profile gets the runtime's default one,
// unless it is privileged; an Unconfined one gets none (the CRI plugin's rule).
func TestAppArmorSpecOpt(t *testing.T) {
	if appArmorSpecOpt(&runtime.Profile{Type: runtime.ProfileUnconfined}, false) != nil ||
		appArmorSpecOpt(nil, true) != nil || appArmorSpecOpt(nil, false) == nil ||
		appArmorSpecOpt(&runtime.Profile{Type: runtime.ProfileRuntimeDefault}, false) == nil {
		t.Error("unconfined and privileged get no profile; the others the runtime's default")
	}
}
