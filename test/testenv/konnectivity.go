package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// KonnectivityVersion is the konnectivity server (sigs.k8s.io/apiserver-network-proxy) that
// hack/build-tools.sh builds from hack/tools/konnectivity-server.
const KonnectivityVersion = "v0.36.0"

// KonnectivityServerPath returns the path of the konnectivity server binary in BinDir.
func KonnectivityServerPath() string {
	return filepath.Join(BinDir(), "konnectivity-server-"+KonnectivityVersion)
}

// Konnectivity is the konnectivity server of ControlPlaneOptions.Konnectivity: the apiserver's
// "cluster" egress goes through it (over a unix socket, gRPC mode), and node agents connect to
// AgentAddress with a client certificate of its agent CA (IssueAgentCertificate). It routes a
// connection only to the agent whose identifiers name the destination host
// (--proxy-strategies=destHost): a node agent that announces the wrong address gets nothing.
type Konnectivity struct {
	// AgentAddress is the server's agent endpoint, 127.0.0.1:PORT.
	AgentAddress string
	// CAFile verifies the server's agent-facing certificate (issued for 127.0.0.1).
	CAFile string

	agentCA *CA
	proc    *Process
}

// IssueAgentCertificate writes a client certificate the server accepts from agents to
// dir/NAME.crt and dir/NAME.key and returns their paths.
func (k *Konnectivity) IssueAgentCertificate(dir, name string) (certFile, keyFile string, err error) {
	return k.agentCA.IssueClient(dir, name, name)
}

// Stop stops the server, as an outage of the tunnel's far end: every agent's stream ends and
// the apiserver's dials through it fail until Start.
func (k *Konnectivity) Stop() error { return k.proc.Stop(syscall.SIGTERM, 10*time.Second) }

// Start starts the server again after Stop, with the same ports, socket and certificates.
func (k *Konnectivity) Start() error { return k.proc.Start() }

// startKonnectivity starts the konnectivity server for t (stopped when t ends, its log printed
// if t failed), waits until it is healthy and returns kube-apiserver's flags that send its
// "cluster" egress through it.
func (cp *ControlPlane) startKonnectivity(ctx context.Context) ([]string, error) {
	if err := checkExecutable(KonnectivityServerPath()); err != nil {
		return nil, fmt.Errorf("konnectivity server: %w (HOLDFAST_TEST_BIN=%s; built by hack/build-tools.sh)", err, BinDir())
	}
	dir := filepath.Join(cp.Dir, "konnectivity")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// A unix socket's path must fit in 108 bytes; the test's directory may not.
	sockDir, err := os.MkdirTemp("", "knp-")
	if err != nil {
		return nil, err
	}
	cp.t.Cleanup(func() { os.RemoveAll(sockDir) })
	uds := filepath.Join(sockDir, "konnectivity.sock")

	serverCA, err := NewCA(dir, "server-ca", "testenv-konnectivity-server-ca")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, err := serverCA.IssueServing(dir, "server", []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	agentCA, err := NewCA(dir, "agent-ca", "testenv-konnectivity-agent-ca")
	if err != nil {
		return nil, err
	}
	// The server refuses ephemeral ports (above 49151) for its listeners.
	ports, err := freeRegisteredPorts(3)
	if err != nil {
		return nil, err
	}
	k := &Konnectivity{AgentAddress: "127.0.0.1:" + strconv.Itoa(ports[0]), CAFile: serverCA.CertFile, agentCA: agentCA}
	k.proc = NewProcess("konnectivity-server", filepath.Join(cp.Dir, "konnectivity-server.log"), KonnectivityServerPath(),
		"--mode=grpc",
		"--uds-name="+uds,
		"--delete-existing-uds-file=true",
		"--server-port=0",
		"--agent-port="+strconv.Itoa(ports[0]),
		"--agent-bind-address=127.0.0.1",
		"--admin-port="+strconv.Itoa(ports[1]),
		"--admin-bind-address=127.0.0.1",
		"--health-port="+strconv.Itoa(ports[2]),
		"--health-bind-address=127.0.0.1",
		"--cluster-cert="+certFile,
		"--cluster-key="+keyFile,
		"--cluster-ca-cert="+agentCA.CertFile,
		"--server-count=1",
		// Only to the agent of the destination host, with no default agent to fall back on: a
		// test whose agent announces the wrong identifiers fails instead of passing by luck.
		"--proxy-strategies=destHost",
		"--v=3",
	)
	cp.t.Cleanup(func() {
		if err := k.proc.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			cp.t.Errorf("konnectivity server cleanup: %v", err)
		}
	})
	logTailOnFailure(cp.t, k.proc)
	if err := k.proc.Start(); err != nil {
		return nil, err
	}
	health := "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/healthz"
	err = poll(ctx, k.proc, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, health, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", health, resp.Status)
		}
		if _, err := os.Stat(uds); err != nil {
			return fmt.Errorf("frontend socket: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for konnectivity server: %w", err)
	}
	egress := filepath.Join(dir, "egress-selector.yaml")
	config := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: GRPC
    transport:
      uds:
        udsName: %s
`, uds)
	if err := os.WriteFile(egress, []byte(config), 0o644); err != nil {
		return nil, err
	}
	cp.Konnectivity = k
	return []string{"--egress-selector-config-file=" + egress}, nil
}

// freeRegisteredPorts returns n distinct loopback TCP ports in the registered range (1024-49151)
// that were free a moment ago, for daemons that refuse ephemeral ports.
func freeRegisteredPorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("find %d free ports in 20000-32767: none after %d tries", n, tries)
		}
		// Below the usual ephemeral range (32768-60999), where no outgoing connection takes one.
		port := 20000 + rand.IntN(12768)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		listeners = append(listeners, l)
		ports = append(ports, port)
	}
	return ports, nil
}
