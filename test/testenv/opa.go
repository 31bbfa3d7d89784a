package testenv

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// OPAVersion is the Open Policy Agent CLI hack/build-tools.sh builds (hack/tools/opa).
const OPAVersion = "v1.22.4"

// OPAPath returns the path of the opa binary in BinDir.
func OPAPath() string { return filepath.Join(BinDir(), "opa-"+OPAVersion) }

// OPABundle compiles Rego as a user does, `opa build -t wasm -e ENTRYPOINT...`, from the
// policy source rego and the data document data (JSON; "" for none), and returns the path of
// the bundle (a .tar.gz holding /policy.wasm, /data.json and /.manifest) in a temporary
// directory of t.
func OPABundle(t testing.TB, rego, data string, entrypoints ...string) string {
	t.Helper()
	if err := checkExecutable(OPAPath()); err != nil {
		t.Fatalf("%v (HOLDFAST_TEST_BIN=%s; built by hack/build-tools.sh)", err, BinDir())
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "policy.rego"), []byte(rego), 0o644); err != nil {
		t.Fatal(err)
	}
	if data != "" {
		if err := os.WriteFile(filepath.Join(src, "data.json"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "bundle.tar.gz")
	args := []string{"build", "-t", "wasm", "-o", out}
	for _, ep := range entrypoints {
		args = append(args, "-e", ep)
	}
	cmd := exec.Command(OPAPath(), append(args, src)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("opa %v: %v\n%s", args, err, b)
	}
	return out
}

// OPAModule returns the /policy.wasm of a bundle OPABundle wrote.
func OPAModule(t testing.TB, bundle string) []byte {
	t.Helper()
	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no /policy.wasm: %v", bundle, err)
		}
		if strings.TrimPrefix(hdr.Name, "/") == "policy.wasm" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
