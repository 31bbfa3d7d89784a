package repo

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRoot: from this package's directory, two levels below the module's, Root finds the
// module's go.mod, not a go.mod of another module on the way (hack/tools/* have their own).
func TestRoot(t *testing.T) {
	want, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if got := Root(t); got != want {
		t.Errorf("Root = %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(want, "hack", "tools", "kubectl", "go.mod")); err != nil {
		t.Fatalf("a nested module to walk past: %v", err)
	}
	t.Chdir(filepath.Join(want, "hack", "tools", "kubectl"))
	if got := Root(t); got != want {
		t.Errorf("from hack/tools/kubectl (a module of its own): Root = %s, want %s", got, want)
	}
}
