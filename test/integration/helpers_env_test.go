// The environment a test starts: a control plane, a containerd, a CNI network and the agent,
// on the runtime backend under test; and what several tests configure in it.

package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// node is the name the agent under test registers, and the identity its kubeconfig carries
// (system:node:gw-test).
const node = "gw-test"

// env is a control plane, a containerd and a CNI network, with a holdfast node agent.
type env struct {
	cp    *testenv.ControlPlane
	cd    *testenv.Containerd
	cni   *testenv.CNINetwork
	agent *testenv.Agent
}

// startEnv starts the environment on the runtime backend under test (testenv.RuntimeUnderTest):
// a control plane with the node registered if withAPI (the agent's kubeconfig points at it),
// standalone otherwise; tune changes the agent's configuration before it starts.
func startEnv(t *testing.T, withAPI bool, tune func(*config.Config)) *env {
	return startEnvOn(t, testenv.RuntimeUnderTest(), withAPI, tune)
}

// startEnvOn is startEnv on the runtime backend given.
func startEnvOn(t *testing.T, backend string, withAPI bool, tune func(*config.Config)) *env {
	var cpOpts *testenv.ControlPlaneOptions
	if withAPI {
		cpOpts = &testenv.ControlPlaneOptions{Nodes: []string{node}}
	}
	return startEnvWith(t, backend, cpOpts, func(e *env, c *config.Config) {
		if withAPI {
			c.Kubeconfig = e.cp.WriteNodeKubeconfig(node)
		}
		if tune != nil {
			tune(c)
		}
	}, nil)
}

// startEnvFor is startEnv with the control plane's options (nil: standalone; the agent's
// kubeconfig is setup's to write), a setup that sees the environment before the agent starts,
// and variables added to the agent's environment.
func startEnvFor(t *testing.T, cpOpts *testenv.ControlPlaneOptions, setup func(*env, *config.Config), agentEnv []string) *env {
	return startEnvWith(t, testenv.RuntimeUnderTest(), cpOpts, setup, agentEnv)
}

// startEnvWith is what every starter above does: the control plane (if cpOpts), containerd and
// CNI for the backend, the agent's configuration as setup leaves it, then the agent.
func startEnvWith(t *testing.T, backend string, cpOpts *testenv.ControlPlaneOptions, setup func(*env, *config.Config), agentEnv []string) *env {
	testenv.RequireIntegration(t)
	e := &env{}
	if cpOpts != nil {
		e.cp = testenv.StartControlPlane(t, *cpOpts)
	}
	dir := t.TempDir()
	cfg := e.startBackend(t, backend, dir)
	if setup != nil {
		setup(e, &cfg)
	}
	e.runtimeFollows(cfg)
	if err := os.MkdirAll(cfg.ManifestDir, 0o755); err != nil {
		t.Fatal(err)
	}
	e.agent = testenv.StartAgentEnv(t, dir, cfg, agentEnv)
	return e
}

// startNodeAPIEnv starts a control plane whose apiserver reaches the node API (its kubelet
// client certificate's CA is the agent's client CA) and the agent, restarts backing off from 1 s.
func startNodeAPIEnv(t *testing.T) *env {
	return startEnvFor(t, &testenv.ControlPlaneOptions{Nodes: []string{node}}, func(e *env, c *config.Config) {
		c.Kubeconfig = e.cp.WriteNodeKubeconfig(node)
		c.Authentication.X509.ClientCAFile = e.cp.KubeletClientCAFile()
		c.Pods.BackOffBase = config.D(time.Second)
	}, nil)
}

// runtimeFollows gives the runtime what a test configured in holdfast where, on the CRI
// backend, the runtime owns it: the registry hosts (its config_path), as an operator of such a
// gateway configures both alike.
func (e *env) runtimeFollows(cfg config.Config) {
	if e.cd.CRI && cfg.Containerd.RegistryConfigPath != "" {
		e.cd.UseRegistryConfig(cfg.Containerd.RegistryConfigPath)
	}
}

// startBackend starts a containerd and a CNI network for the runtime backend, with the test
// images, and returns the agent's configuration for them, its paths under dir: holdfast's CNI
// in its own namespace, or the CRI plugin's network and namespace.
func (e *env) startBackend(t *testing.T, backend, dir string) config.Config {
	t.Logf("runtime backend: %s", backend)
	e.cni = testenv.CNI(t)
	if backend == config.RuntimeCRI {
		e.cd = testenv.StartContainerd(t, testenv.ContainerdOptions{EnableCRI: true, CNI: e.cni})
	} else {
		e.cd = testenv.StartContainerd(t, testenv.ContainerdOptions{})
	}
	e.cd.ImportTestImages(context.Background(), e.namespace())
	cfg := testenv.NewAgentConfig(t, dir, e.cd, e.cni)
	cfg.NodeName = node
	if backend == config.RuntimeCRI {
		cfg.Runtime, cfg.CRIEndpoint = config.RuntimeCRI, "unix://"+e.cd.Address
	}
	return cfg
}

// namespace is the containerd namespace of the agent's images and containers: its own, or the
// CRI plugin's.
func (e *env) namespace() string {
	if e.cd.CRI {
		return "k8s.io"
	}
	return "holdfast"
}

// quickBackoff makes the agent restart containers, renew its Lease and report the node within
// seconds, so that a test of restarts and outages does not wait for the defaults.
func quickBackoff(c *config.Config) {
	c.Pods.BackOffBase = config.D(time.Second)
	c.Pods.BackOffMax = config.D(2 * time.Second)
	c.NodeStatus.LeaseRenewInterval = config.D(time.Second)
	c.NodeStatus.LeaseDuration = config.D(5 * time.Second)
	c.NodeStatus.UpdateFrequency = config.D(2 * time.Second)
}

// withPolicy builds an example policy from source into a policy dir of its own, with the
// given policies.yaml entry, and returns the config change that makes it the node's policy.
func withPolicy(t *testing.T, pkgDir, entry string) func(*config.Config) {
	module := wasmtest.BuildGo(t, pkgDir)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(pkgDir)+".wasm"), module, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n" + entry
	if err := os.WriteFile(filepath.Join(dir, "policies.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) {
		quickBackoff(c)
		c.PolicyDir = dir
	}
}

// publishRootCA does what kube-controller-manager's root CA publisher does in a real cluster:
// the kube-root-ca.crt ConfigMap that every service account volume projects.
func publishRootCA(t *testing.T, e *env, namespace string) {
	t.Helper()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: namespace},
		Data: map[string]string{"ca.crt": string(e.cp.CAData())}}
	if _, err := e.cp.Admin.CoreV1().ConfigMaps(namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
