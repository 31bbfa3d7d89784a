// Package repo finds the checkout a test runs in, for the tests and harnesses that read or
// build files of the repository (docs, hack/ scripts, policy sources, testdata of another
// package) whichever package directory go test runs them from.
package repo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// module is the line of go.mod that names holdfast's module.
const module = "module github.com/holdfast-dev/holdfast\n"

// Root returns the directory of holdfast's go.mod: the first one above the working directory
// (go test's: the package's directory) that declares the module. It fails the test if there is
// none.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), module) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repo: no go.mod of github.com/holdfast-dev/holdfast above the working directory")
		}
		dir = parent
	}
}
