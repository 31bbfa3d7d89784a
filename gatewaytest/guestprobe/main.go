// Command guestprobe runs inside the gateway test VM (it rides on the payload disk) and prints,
// as JSON, what containerd holds in holdfast's namespace: every container with its labels and
// its task's state. The tests count containers per pod and container name from it, to prove
// that nothing was started twice, with or without the apiserver.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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
	if err := flags.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
