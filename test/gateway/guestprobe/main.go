// Command guestprobe runs inside the gateway test VM (it rides on the payload disk) and prints,
// as JSON, what containerd holds in holdfast's namespace: every container with its labels and
// its task's state. The tests count containers per pod and container name from it, to prove
// that nothing was started twice, with or without the apiserver.
//
// With -stats it prints instead the node's stats summary as holdfast serves it on its local
// socket (GET /stats/summary): the guest's node API is out of the host apiserver's reach.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// Container is one containerd container and its task.
type Container struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	// Task is the task's status ("running", "stopped", ...), empty when it has none.
	Task string `json:"task,omitempty"`
	PID  uint32 `json:"pid,omitempty"`
}

func main() { os.Exit(doMain(os.Args[1:], os.Stdout, os.Stderr)) }

func doMain(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("guestprobe", flag.ContinueOnError)
	address := flags.String("address", "/run/containerd/containerd.sock", "containerd's socket")
	namespace := flags.String("namespace", "holdfast", "containerd namespace")
	stats := flags.Bool("stats", false, "print holdfast's stats summary, read from its local socket")
	socket := flags.String("socket", "/var/lib/holdfast/api.sock", "holdfast's local API socket (with -stats)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if *stats {
		if err := summary(ctx, *socket, stdout); err != nil {
			fmt.Fprintf(stderr, "guestprobe: %v\n", err)
			return 1
		}
		return 0
	}
	containers, err := list(namespaces.WithNamespace(ctx, *namespace), *address)
	if err != nil {
		fmt.Fprintf(stderr, "guestprobe: %v\n", err)
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(containers); err != nil {
		fmt.Fprintf(stderr, "guestprobe: %v\n", err)
		return 1
	}
	return 0
}

// summary copies GET /stats/summary of holdfast's local socket to w.
func summary(ctx context.Context, socket string, w io.Writer) error {
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://holdfast/stats/summary", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("stats summary from %s: %w", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("stats summary from %s: %s: %s", socket, resp.Status, b)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func list(ctx context.Context, address string) ([]Container, error) {
	client, err := containerd.New(address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	defer client.Close()
	recs, err := client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]Container, 0, len(recs))
	for _, rec := range recs {
		labels, err := rec.Labels(ctx)
		if errdefs.IsNotFound(err) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("labels of %s: %w", rec.ID(), err)
		}
		c := Container{ID: rec.ID(), Labels: labels}
		task, err := rec.Task(ctx, nil)
		switch {
		case errdefs.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("task of %s: %w", rec.ID(), err)
		default:
			st, err := task.Status(ctx)
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return nil, fmt.Errorf("status of %s: %w", rec.ID(), err)
			}
			c.Task, c.PID = string(st.Status), task.Pid()
		}
		out = append(out, c)
	}
	return out, nil
}
