package runtime

import (
	"os"
	"strconv"
	"strings"
)

// ClampOOMScoreAdj keeps a container's score at the agent's own (own) or above: lowering it
// needs CAP_SYS_RESOURCE, which some sandboxes (and some gateway setups) do not grant, and runc
// then fails the start with an unhelpful error. Under the firmware's unit the agent runs at
// -999 (OOMScoreAdjust), below every QoS score, so the clamp leaves kubelet's scores as they
// are; an agent left at 0 clamps Guaranteed pods to 0.
func ClampOOMScoreAdj(adj, own int) int { return max(adj, own) }

// AgentOOMScoreAdj is the agent's own OOM score adjustment; ok is false where it cannot be read.
func AgentOOMScoreAdj() (adj int, ok bool) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return v, err == nil
}
