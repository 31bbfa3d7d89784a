package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/status"
)

// newPodsCmd lists the pods of the agent running on this machine, from its local API socket:
// it works with no apiserver, which is the point on an offline gateway.
func newPodsCmd(stdout io.Writer) *cobra.Command {
	var socket string
	var watch bool
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the pods of the holdfast running on this machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			last := ""
			c := newLocalClient(socket) // one for the watch: its connection is kept, not one a second
			for {
				out, err := renderPods(cmd.Context(), c)
				if err != nil && !watch {
					return err
				}
				if err != nil {
					out = "waiting for holdfast: " + err.Error() + "\n"
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
	cmd.Flags().StringVar(&socket, "socket", defaultLocalSocket, "the agent's local API socket (localAPISocket)")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print again whenever something changes")
	return cmd
}

func renderPods(ctx context.Context, c *localClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := c.do(ctx, http.MethodGet, "/pods", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list v1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return "", fmt.Errorf("decode /pods: %w", err)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSOURCE\tPHASE\tREADY\tRESTARTS\tIP\tCONTAINERS")
	for i := range list.Items {
		p := status.ViewOf(&list.Items[i])
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
