package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/holdfast-dev/holdfast/agent/status"
)

// newPodsCmd lists the pods of the agent running on this machine, from its local endpoint:
// it works with no apiserver, which is the point on an offline gateway.
func newPodsCmd(stdout io.Writer) *cobra.Command {
	var addr string
	var watch bool
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pods of the holdfast running on this machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			last := ""
			for {
				out, err := renderPods(addr)
				if err != nil && !watch {
					return err
				}
				if err != nil {
					out = "waiting for holdfast at " + addr + ": " + err.Error() + "\n"
				}
				if out != last {
					if watch {
						fmt.Fprintf(stdout, "--- %s\n", time.Now().Format(time.TimeOnly))
					}
					fmt.Fprint(stdout, out)
					last = out
				}
				if !watch {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		},
	}
	cmd.Flags().StringVar(&addr, "address", "127.0.0.1:10248", "the agent's healthz address")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print again whenever something changes")
	return cmd
}

func renderPods(addr string) (string, error) {
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + addr + "/pods")
	if err != nil {
		return "", fmt.Errorf("ask holdfast: %w", err)
	}
	defer resp.Body.Close()
	var pods []status.PodView
	if err := json.NewDecoder(resp.Body).Decode(&pods); err != nil {
		return "", fmt.Errorf("decode /pods: %w", err)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSOURCE\tPHASE\tREADY\tRESTARTS\tIP\tCONTAINERS")
	for _, p := range pods {
		ready, restarts := 0, int32(0)
		var states []string
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready {
				ready++
			}
			restarts += cs.RestartCount
			s := cs.Name + ":"
			switch {
			case cs.State.Running != nil:
				s += "Running"
			case cs.State.Terminated != nil:
				s += cs.State.Terminated.Reason
			case cs.State.Waiting != nil:
				s += cs.State.Waiting.Reason
			}
			states = append(states, s)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", p.Namespace, p.Name, p.Source, p.Status.Phase,
			ready, len(p.Status.ContainerStatuses), restarts, p.Status.PodIP, strings.Join(states, " "))
	}
	tw.Flush()
	return b.String(), nil
}
