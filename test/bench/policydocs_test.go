package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/repo"
)

// TestPolicyDocsGenerated: the policy figures of docs/policies.md and README.md are what
// test/bench/policies.go renders of the run kept in docs/policy-figures.json (no hand edit in a
// generated block, no renderer change without a run since), the figures' header names a
// dated run, and no timing figure or comparison stands outside the generated blocks.
func TestPolicyDocsGenerated(t *testing.T) {
	root := repo.Root(t)
	run, err := ReadPolicyRun(root)
	if err != nil {
		t.Fatalf("%v: make bench-policies writes it", err)
	}
	page, readme, err := RenderPolicyDocs(root, run)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{policyDocsPage: page, policyDocsReadme: readme} {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s's generated policy figures differ from what test/bench/policies.go renders of %s (edited by hand, or rendered "+
				"differently since that run): run make bench-policies, never edit them", name, policyRunFile)
		}
	}
	figures, ok := GeneratedBlock(page, figuresBlock)
	if !ok {
		t.Fatalf("%s has no generated block %s", policyDocsPage, figuresBlock)
	}
	header, _, _ := strings.Cut(figures, "\n")
	if m := policyHeaderPattern.FindStringSubmatch(header); m == nil {
		t.Errorf("%s: the figures' header %q does not match %s", policyDocsPage, header, policyHeaderPattern)
	} else if _, err := time.Parse("2006-01-02 15:04 MST", m[1]); err != nil {
		t.Errorf("%s: the figures' date: %v", policyDocsPage, err)
	}

	timing := regexp.MustCompile(`\b\d+(\.\d+)?\s?(ns|us|µs|ms)\b|\b\d+(\.\d+)?x\b|(?i)\b(faster|slower)\b`)
	policyLine := regexp.MustCompile(`(?i)wasm|rego|\bopa\b|polic`)
	for name, doc := range map[string]string{policyDocsPage: page, policyDocsReadme: readme} {
		for i, line := range strings.Split(withoutGenerated(doc), "\n") {
			// docs/policies.md is about policies throughout; in the README, only its policy lines.
			if name == policyDocsReadme && !policyLine.MatchString(line) {
				continue
			}
			if f := timing.FindString(line); f != "" {
				t.Errorf("%s: %q outside the generated blocks (line %d of the page without them): %s", name, f, i+1, line)
			}
		}
	}
}

// withoutGenerated is doc with its generated blocks cut out, markers included.
func withoutGenerated(doc string) string {
	for _, name := range []string{summaryBlock, figuresBlock} {
		if before, rest, ok := strings.Cut(doc, "<!-- BEGIN GENERATED "+name+":"); ok {
			if _, after, ok := strings.Cut(rest, endMarker(name)); ok {
				doc = before + after
			}
		}
	}
	return doc
}
