package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/spdy"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/holdfast-dev/holdfast/agent/manifest"
	"github.com/holdfast-dev/holdfast/agent/nodeapi"
)

// defaultLocalSocket is the agent's local API socket with the default configuration
// (localAPISocket: <stateDir>/api.sock).
const defaultLocalSocket = "/var/lib/holdfast/api.sock"

// localClient talks to the agent on this machine over its local API socket: the node API's
// handlers, with no apiserver, so that an operator can read logs, exec and restart pods on a
// gateway whose cluster is out of reach.
type localClient struct {
	socket string
	http   *http.Client
	tr     *http.Transport
}

func newLocalClient(socket string) *localClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}
	return &localClient{socket: socket, http: &http.Client{Transport: tr}, tr: tr}
}

// url is path on the agent; the host is a placeholder, the socket is what is dialed.
func (c *localClient) url(path string, q url.Values) *url.URL {
	return &url.URL{Scheme: "http", Host: "holdfast", Path: path, RawQuery: q.Encode()}
}

func (c *localClient) do(ctx context.Context, method, path string, q url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q).String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reach holdfast at %s (is it running, and are you root?): %w", c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%s", strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// container resolves the container name: the one given, else the pod's default (kubectl's
// annotation kubectl.kubernetes.io/default-container, else its first container).
func (c *localClient) container(ctx context.Context, ns, pod, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	resp, err := c.do(ctx, http.MethodGet, "/pods", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list v1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return "", fmt.Errorf("read the agent's pods: %w", err)
	}
	for _, p := range list.Items {
		if p.Namespace != ns || p.Name != pod {
			continue
		}
		if d := p.Annotations["kubectl.kubernetes.io/default-container"]; d != "" {
			return d, nil
		}
		if len(p.Spec.Containers) > 0 {
			return p.Spec.Containers[0].Name, nil
		}
	}
	return "", fmt.Errorf("pod %s/%s does not run here (holdfast pods lists those that do)", ns, pod)
}

func newLogsCmd(stdout io.Writer) *cobra.Command {
	var (
		socket, ns, container, since string
		follow, previous, timestamps bool
		tail                         int64
	)
	cmd := &cobra.Command{
		Use:   "logs POD",
		Short: "Print a container's logs from the holdfast on this machine (no apiserver needed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := newLocalClient(socket)
			name, err := c.container(cmd.Context(), ns, args[0], container)
			if err != nil {
				return err
			}
			q := url.Values{}
			if follow {
				q.Set("follow", "true")
			}
			if previous {
				q.Set("previous", "true")
			}
			if timestamps {
				q.Set("timestamps", "true")
			}
			if tail >= 0 {
				q.Set("tailLines", strconv.FormatInt(tail, 10))
			}
			if since != "" {
				d, err := time.ParseDuration(since)
				if err != nil {
					return fmt.Errorf("--since: %w", err)
				}
				q.Set("sinceSeconds", strconv.FormatInt(int64(d.Seconds()), 10))
			}
			resp, err := c.do(cmd.Context(), http.MethodGet, "/containerLogs/"+ns+"/"+args[0]+"/"+name, q)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.Copy(stdout, resp.Body)
			return err
		},
	}
	f := cmd.Flags()
	localFlags(f, &socket, &ns)
	f.StringVarP(&container, "container", "c", "", "the container (default: the pod's default container)")
	f.BoolVarP(&follow, "follow", "f", false, "stream the log as it grows")
	f.BoolVarP(&previous, "previous", "p", false, "the previous instance of the container")
	f.BoolVar(&timestamps, "timestamps", false, "prefix each line with its time")
	f.Int64Var(&tail, "tail", -1, "only the last lines (-1: all)")
	f.StringVar(&since, "since", "", "only lines newer than this duration (5s, 2m, 3h)")
	return cmd
}

func newExecCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		socket, ns, container string
		stdin, tty            bool
	)
	cmd := &cobra.Command{
		Use:   "exec POD [-c CONTAINER] [-i] [-t] -- COMMAND [ARG...]",
		Short: "Run a command in a container of the holdfast on this machine (no apiserver needed)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return errors.New("usage: holdfast exec POD [-c CONTAINER] [-i] [-t] -- COMMAND [ARG...]")
			}
			c := newLocalClient(socket)
			name, err := c.container(cmd.Context(), ns, args[0], container)
			if err != nil {
				return err
			}
			q := url.Values{"command": args[1:]}
			q.Set("output", "1")
			q.Set("error", "1")
			if stdin {
				q.Set("input", "1")
			}
			if tty {
				q.Set("tty", "1")
				q.Del("error") // a terminal has one output stream
			}
			rt, err := spdy.NewRoundTripperWithConfig(spdy.RoundTripperConfig{UpgradeTransport: c.tr, PingPeriod: 5 * time.Second})
			if err != nil {
				return err
			}
			ex, err := remotecommand.NewSPDYExecutorForTransports(rt, rt, http.MethodPost, c.url("/exec/"+ns+"/"+args[0]+"/"+name, q))
			if err != nil {
				return err
			}
			opts := remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr, Tty: tty}
			if tty {
				opts.Stderr = nil
			}
			if stdin {
				opts.Stdin = os.Stdin
			}
			if fd := int(os.Stdin.Fd()); tty && term.IsTerminal(fd) {
				state, err := term.MakeRaw(fd)
				if err != nil {
					return err
				}
				defer func() { _ = term.Restore(fd, state) }()
				if w, h, err := term.GetSize(fd); err == nil {
					opts.TerminalSizeQueue = &fixedSize{size: remotecommand.TerminalSize{Width: uint16(w), Height: uint16(h)}}
				}
			}
			err = ex.StreamWithContext(cmd.Context(), opts)
			var exitErr utilexec.ExitError
			if errors.As(err, &exitErr) {
				return exitCode(exitErr.ExitStatus())
			}
			return err
		},
	}
	f := cmd.Flags()
	localFlags(f, &socket, &ns)
	f.StringVarP(&container, "container", "c", "", "the container (default: the pod's default container)")
	f.BoolVarP(&stdin, "stdin", "i", false, "pass standard input to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run the command in a terminal")
	return cmd
}

func newRestartCmd(stdout io.Writer) *cobra.Command {
	var socket, ns string
	cmd := &cobra.Command{
		Use:   "restart POD",
		Short: "Stop a pod's running containers so that they start again by their restart policy (no apiserver needed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := newLocalClient(socket).do(cmd.Context(), http.MethodPost, "/restart/"+ns+"/"+args[0], nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			_, err = io.Copy(stdout, resp.Body)
			return err
		},
	}
	localFlags(cmd.Flags(), &socket, &ns)
	return cmd
}

func newDescribeCmd(stdout io.Writer) *cobra.Command {
	var socket, ns string
	cmd := &cobra.Command{
		Use:   "describe POD",
		Short: "Show a pod as the holdfast on this machine runs it: status, admission, recent events (no apiserver needed)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := newLocalClient(socket).do(cmd.Context(), http.MethodGet, "/describe/"+ns+"/"+args[0], nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var d nodeapi.Description
			if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
				return fmt.Errorf("read the description: %w", err)
			}
			_, err = io.WriteString(stdout, renderDescription(d))
			return err
		},
	}
	localFlags(cmd.Flags(), &socket, &ns)
	return cmd
}

// renderDescription prints a description in the spirit of kubectl describe.
func renderDescription(d nodeapi.Description) string {
	var b strings.Builder
	p := d.Pod
	source := "api"
	if manifest.IsStatic(p) {
		source = "static manifest"
	}
	fmt.Fprintf(&b, "Name:       %s\nNamespace:  %s\nUID:        %s\nSource:     %s\nPhase:      %s\n", p.Name, p.Namespace, p.UID, source, p.Status.Phase)
	if p.Status.Reason != "" || p.Status.Message != "" {
		fmt.Fprintf(&b, "Reason:     %s\nMessage:    %s\n", p.Status.Reason, p.Status.Message)
	}
	if p.Status.PodIP != "" {
		fmt.Fprintf(&b, "IP:         %s\n", p.Status.PodIP)
	}
	switch a := d.Admission; {
	case a == nil:
		b.WriteString("Admission:  not decided yet\n")
	case a.Admitted:
		b.WriteString("Admission:  admitted\n")
	default:
		fmt.Fprintf(&b, "Admission:  rejected (%s): %s\n", a.Reason, a.Message)
	}
	b.WriteString("Conditions:\n")
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "  %-26s %s %s\n", c.Type, c.Status, c.Reason)
	}
	b.WriteString("Containers:\n")
	for _, list := range [][]v1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			state := "unknown"
			switch {
			case cs.State.Running != nil:
				state = "running since " + cs.State.Running.StartedAt.UTC().Format(time.RFC3339)
			case cs.State.Waiting != nil:
				state = "waiting: " + cs.State.Waiting.Reason
				if cs.State.Waiting.Message != "" {
					state += " (" + cs.State.Waiting.Message + ")"
				}
			case cs.State.Terminated != nil:
				state = fmt.Sprintf("terminated: %s, exit %d", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
			}
			fmt.Fprintf(&b, "  %s: %s; ready %v, restarts %d\n", cs.Name, state, cs.Ready, cs.RestartCount)
		}
	}
	b.WriteString("Events (kept in the agent's memory since it started):\n")
	if len(d.Events) == 0 {
		b.WriteString("  none\n")
	}
	for _, e := range d.Events {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		count := ""
		if e.Count > 1 {
			count = fmt.Sprintf(" (x%d)", e.Count)
		}
		fmt.Fprintf(&b, "  %s  %-7s  %-20s %s%s\n", at.UTC().Format(time.RFC3339), e.Type, e.Reason, e.Message, count)
	}
	return b.String()
}

// localFlags are the flags every local command has: where the agent is, which namespace.
func localFlags(f *pflag.FlagSet, socket, ns *string) {
	f.StringVar(socket, "socket", defaultLocalSocket, "the agent's local API socket (localAPISocket)")
	f.StringVarP(ns, "namespace", "n", "default", "the pod's namespace")
}

// fixedSize is a terminal size sent once.
type fixedSize struct {
	size remotecommand.TerminalSize
	sent bool
}

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	if f.sent {
		return nil
	}
	f.sent = true
	return &f.size
}

// exitCode is a command's exit status passed on as holdfast's.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("command terminated with exit code %d", int(e)) }
func (e exitCode) ExitCode() int { return int(e) }
