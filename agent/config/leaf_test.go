package config

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The configuration is a leaf: reading and checking one needs nothing of the agent, so that
// what imports it (the CLI, the harnesses, every part of the agent) does not drag in the
// runtime clients with it. Before, it imported agent/eviction, and with it containerd's
// client: `go list -deps ./agent/config` listed 650 packages, 272 after.
func TestConfigImportsNothingOfTheAgent(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"github.com/holdfast-dev/holdfast/", "github.com/containerd/", "github.com/tetratelabs/wazero", "k8s.io/client-go/"}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, prefix := range forbidden {
				if strings.HasPrefix(path, prefix) {
					t.Errorf("%s imports %s", f, path)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source file found")
	}
}
