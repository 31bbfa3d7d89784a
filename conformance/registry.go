package conformance

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/internal/testenv"
)

// startRegistry starts the distribution registry on a free loopback port, plain HTTP (which
// containerd's resolvers use for loopback hosts without configuration), storing under a
// directory of t's. It returns HOST:PORT once the registry answers /v2/.
func startRegistry(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	ln.Close()
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s
`, filepath.Join(dir, "storage"), host)
	configPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testenv.NewProcess("registry", filepath.Join(dir, "registry.log"), registryPath(), "serve", configPath)
	startDaemon(t, p)
	hc := &http.Client{Timeout: 5 * time.Second}
	testenv.Eventually(t, time.Minute, "the registry answers /v2/", func() error {
		if !p.Running() {
			return fmt.Errorf("registry exited: %s", p.LogTail(20))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/v2/: %s", resp.Status)
		}
		return nil
	})
	return host
}
