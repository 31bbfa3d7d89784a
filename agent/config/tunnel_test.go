package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTunnel(t *testing.T) {
	const base = "nodeName: gw-1\nkubeconfig: /etc/holdfast/kubeconfig\n"
	for _, tc := range []struct {
		name, yaml, wantErr string
	}{
		{"none", base, ""},
		{"mTLS", base + "tunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  certFile: a.crt\n  keyFile: a.key\n  only: true\n", ""},
		{"token", base + "tunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  tokenFile: token\n  agentIdentifiers: host=gw-1&ipv4=10.0.0.7\n", ""},
		{"no server", base + "tunnel:\n  only: true\n", "tunnel: server is empty"},
		{"server without port", base + "tunnel:\n  server: knp.example\n  caFile: ca.crt\n  tokenFile: t\n", "want host:port"},
		{"no CA", base + "tunnel:\n  server: knp.example:8132\n  tokenFile: t\n", "tunnel.caFile is required"},
		{"no credentials", base + "tunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n", "tunnel: no credentials"},
		{"cert without key", base + "tunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  certFile: a.crt\n", "go together"},
		{"bad identifier", base + "tunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  tokenFile: t\n  agentIdentifiers: ip=10.0.0.7\n", `"ip" is not an identifier type`},
		{"node API off", base + "port: 0\ntunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  tokenFile: t\n", "tunnel needs the node API"},
		{"standalone", "nodeName: gw-1\ntunnel:\n  server: knp.example:8132\n  caFile: ca.crt\n  tokenFile: t\n", "tunnel needs an apiserver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Tunnel.Server != "" && c.Tunnel.AgentID != "gw-1" {
				t.Errorf("agentID %q, want the node name", c.Tunnel.AgentID)
			}
		})
	}
}
