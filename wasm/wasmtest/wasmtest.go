// Package wasmtest builds test modules from source, for tests of the engine,
// the policy adapter and the CLI: Go policies with the standard toolchain
// (GOOS=wasip1, -buildmode=c-shared), WAT with wabt's wat2wasm, C with
// clang. Nothing built is checked in, so `go test` works from a fresh clone
// on a machine with the toolchains (apt-get install -y wabt clang lld).
//
// Go builds are cached under the user's cache directory, keyed by a hash of
// the sources, so a second run takes milliseconds instead of a link.
package wasmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast-dev/holdfast/test/repo"
)

// CacheDir returns a directory that survives test runs, for built modules
// and for wazero's compilation cache (so that only the first run compiles).
func CacheDir(t testing.TB, name string) string {
	t.Helper()
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "holdfast-test", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

var buildMu sync.Mutex // serializes builds within one test binary

// BuildGo builds the Go policy in pkgDir (relative to the repository root,
// e.g. "policies/examples/admission/allowed-registries") and returns the
// module's bytes.
func BuildGo(t testing.TB, pkgDir string) []byte {
	t.Helper()
	root := repo.Root(t)
	key, err := sourceKey(root, pkgDir)
	if err != nil {
		t.Fatalf("wasmtest: hash %s: %v", pkgDir, err)
	}
	cached := filepath.Join(CacheDir(t, "modules"), strings.ReplaceAll(pkgDir, "/", "_")+"-"+key+".wasm")
	if b, err := os.ReadFile(cached); err == nil {
		return b
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, err := os.ReadFile(cached); err == nil {
		return b
	}
	tmp := cached + fmt.Sprintf(".%d.tmp", os.Getpid())
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-buildmode=c-shared", "-trimpath", "-o", tmp, "./"+pkgDir)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: GOOS=wasip1 GOARCH=wasm go build %s: %v\n%s", pkgDir, err, out)
	}
	if err := os.Rename(tmp, cached); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cached)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sourceKey hashes what a Go policy build depends on in this repository:
// the package's files, the SDK, go.mod, go.sum and the toolchain version.
func sourceKey(root, pkgDir string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	var files []string
	for _, dir := range []string{pkgDir, "policies/sdk/go"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", strings.TrimPrefix(f, root), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// BuildWAT assembles a WAT file (relative to the repository root) with
// wat2wasm.
func BuildWAT(t testing.TB, file string) []byte {
	t.Helper()
	return assemble(t, filepath.Join(repo.Root(t), file))
}

// AssembleWAT assembles WAT source text with wat2wasm and its flags, e.g.
// "--no-check" for a module that is invalid on purpose (wat2wasm then
// writes indices and types as they are written, unchecked).
func AssembleWAT(t testing.TB, src string, flags ...string) []byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "module.wat")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return assemble(t, file, flags...)
}

func assemble(t testing.TB, file string, flags ...string) []byte {
	t.Helper()
	bin := lookTool(t, "wat2wasm", "wabt")
	out := filepath.Join(t.TempDir(), filepath.Base(file)+".wasm")
	cmd := exec.Command(bin, append(append([]string{file}, flags...), "-o", out)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: wat2wasm %s: %v\n%s", file, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BuildC compiles a C file (relative to the repository root) for wasm32
// with clang and lld, without libc.
func BuildC(t testing.TB, file string) []byte {
	t.Helper()
	bin := lookTool(t, "clang", "clang lld")
	lookTool(t, "wasm-ld", "lld")
	out := filepath.Join(t.TempDir(), filepath.Base(file)+".wasm")
	cmd := exec.Command(bin, "--target=wasm32", "-O2", "-nostdlib", "-Wl,--no-entry", "-o", out, filepath.Join(repo.Root(t), file))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("wasmtest: clang %s: %v\n%s", file, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func lookTool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("wasmtest: %s not found; install it: apt-get install -y %s", name, pkg)
	}
	return p
}

// SpecSuiteDir returns the directory of the WebAssembly spec test suite as
// wazero keeps it for its own tests, in the module cache beside the wazero
// this repository builds with: version is "v1" or "v2" (the 2.0 core
// features), and the directory holds wast2json's output, a .json script per
// .wast file and its .wasm modules. It fails the test, never skips it, when
// the suite is not there.
func SpecSuiteDir(t testing.TB, version string) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "list", "-m", "-f", "{{.Dir}}", "github.com/tetratelabs/wazero")
	cmd.Dir = repo.Root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("wasmtest: go list -m github.com/tetratelabs/wazero: %v; the spec test suite is read from wazero's module", err)
	}
	module := strings.TrimSpace(string(out))
	dir := filepath.Join(module, "internal", "integration_test", "spectest", version, "testdata")
	scripts, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if module == "" || len(scripts) == 0 {
		t.Fatalf("wasmtest: no spec test suite in %q (wazero's module directory is %q): run `go mod download github.com/tetratelabs/wazero`; a wazero release without internal/integration_test/spectest/%s/testdata needs this helper updated", dir, module, version)
	}
	return dir
}
