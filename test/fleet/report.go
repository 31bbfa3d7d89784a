package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Markdown is the results as docs/fleet.md shows them: the control plane's use with each
// fleet, per node (the fleet's less the idle control plane's, divided by the nodes), and the
// requests per node by verb and resource.
func Markdown(results []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| | %s |\n|---|%s\n", strings.Join(agentNames(results), " | "), strings.Repeat("---:|", len(results)))
	row := func(name string, f func(Result) string) {
		cells := make([]string, len(results))
		for i, r := range results {
			cells[i] = f(r)
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
	row("nodes, pods", func(r Result) string { return fmt.Sprintf("%d, %d", r.Nodes, r.Pods) })
	row("all nodes Ready after", func(r Result) string { return fmt.Sprintf("%.0f s", r.ReadySeconds) })
	row("all pods Running after", func(r Result) string { return fmt.Sprintf("%.0f s", r.RunningSeconds) })
	row("window (idle, fleet)", func(r Result) string { return fmt.Sprintf("%.0f s, %.0f s", r.Idle.Seconds, r.Fleet.Seconds) })
	row("kube-apiserver CPU, idle → fleet", func(r Result) string {
		return fmt.Sprintf("%.0f → %.0f mcores", r.Idle.APIServerCores*1000, r.Fleet.APIServerCores*1000)
	})
	row("etcd CPU, idle → fleet", func(r Result) string {
		return fmt.Sprintf("%.0f → %.0f mcores", r.Idle.EtcdCores*1000, r.Fleet.EtcdCores*1000)
	})
	row("kube-apiserver RSS, idle → fleet (peak)", func(r Result) string {
		return fmt.Sprintf("%.0f → %.0f (%.0f) MiB", r.Idle.APIServerRSSMiB, r.Fleet.APIServerRSSMiB, r.Fleet.APIServerRSSMaxMiB)
	})
	row("etcd RSS, idle → fleet (peak)", func(r Result) string {
		return fmt.Sprintf("%.0f → %.0f (%.0f) MiB", r.Idle.EtcdRSSMiB, r.Fleet.EtcdRSSMiB, r.Fleet.EtcdRSSMaxMiB)
	})
	row("requests, idle → fleet", func(r Result) string {
		return fmt.Sprintf("%.0f → %.0f /min", r.Idle.TotalRequestsPerMinute(), r.Fleet.TotalRequestsPerMinute())
	})
	row("**per node**: apiserver CPU", func(r Result) string {
		return fmt.Sprintf("%.2f mcores", perNode(r, func(u Usage) float64 { return u.APIServerCores * 1000 }))
	})
	row("per node: etcd CPU", func(r Result) string {
		return fmt.Sprintf("%.2f mcores", perNode(r, func(u Usage) float64 { return u.EtcdCores * 1000 }))
	})
	row("per node: apiserver RSS", func(r Result) string {
		return fmt.Sprintf("%.2f MiB", perNode(r, func(u Usage) float64 { return u.APIServerRSSMiB }))
	})
	row("per node: etcd RSS", func(r Result) string {
		return fmt.Sprintf("%.2f MiB", perNode(r, func(u Usage) float64 { return u.EtcdRSSMiB }))
	})
	row("per node: requests", func(r Result) string {
		return fmt.Sprintf("%.2f /min", perNode(r, func(u Usage) float64 { return u.TotalRequestsPerMinute() }))
	})
	row("the agents' processes, RSS per node (this machine)", func(r Result) string { return fmt.Sprintf("%.1f MiB", r.Fleet.AgentsRSSMiB/float64(r.Nodes)) })

	b.WriteString("\nRequests per node per minute, by verb and resource (the fleet's less the idle control plane's):\n\n")
	fmt.Fprintf(&b, "| request | %s |\n|---|%s\n", strings.Join(agentNames(results), " | "), strings.Repeat("---:|", len(results)))
	keys := map[string]bool{}
	for _, r := range results {
		for k := range r.Fleet.RequestsPerMinute {
			keys[k] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		cells := make([]string, len(results))
		shown := false
		for i, r := range results {
			v := (r.Fleet.RequestsPerMinute[k] - r.Idle.RequestsPerMinute[k]) / float64(r.Nodes)
			cells[i] = fmt.Sprintf("%.2f", v)
			shown = shown || v >= 0.005
		}
		if shown {
			fmt.Fprintf(&b, "| `%s` | %s |\n", k, strings.Join(cells, " | "))
		}
	}
	return b.String()
}

// perNode is the fleet's figure less the idle control plane's, per node.
func perNode(r Result, f func(Usage) float64) float64 {
	return (f(r.Fleet) - f(r.Idle)) / float64(r.Nodes)
}

func agentNames(results []Result) []string {
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.Agent
	}
	return names
}
