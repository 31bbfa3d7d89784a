package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Result is one test's outcome in a JUnit report of the suite.
type Result struct {
	// State is passed, failed or skipped (ginkgo's panicked, timedout and interrupted count
	// as failed).
	State string
	// Message is the failure or skip message.
	Message string
	// Seconds is how long the test ran.
	Seconds float64
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// parseJUnit reads ginkgo's JUnit report and returns the results of the tests the focus
// selects, by test name (without ginkgo's "[It] " prefix).
func parseJUnit(r io.Reader, focus *regexp.Regexp) (map[string]Result, error) {
	var s junitSuites
	if err := xml.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("decode JUnit report: %w", err)
	}
	results := map[string]Result{}
	for _, suite := range s.Suites {
		for _, c := range suite.Cases {
			name, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok || !focus.MatchString(name) {
				continue // suite setup nodes, and tests outside the selection
			}
			res := Result{Seconds: c.Time}
			switch {
			case c.Status == "passed":
				res.State = "passed"
			case c.Status == "skipped" || c.Status == "pending":
				res.State = "skipped"
				if c.Skipped != nil {
					res.Message = c.Skipped.Message
				}
			default:
				res.State = "failed"
				switch {
				case c.Failure != nil:
					res.Message = c.Failure.Message + "\n" + c.Failure.Text
				case c.Error != nil:
					res.Message = c.Error.Message + "\n" + c.Error.Text
				}
			}
			results[name] = res
		}
	}
	return results, nil
}

func readJUnit(path string, focus *regexp.Regexp) (map[string]Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseJUnit(f, focus)
}

// Cause is a class of holdfast failures: what the test needed that holdfast does not do.
type Cause struct {
	// Name is the short label used in the tables.
	Name string
	// Pattern matches the test's name or its failure message.
	Pattern *regexp.Regexp
	// OnName says Pattern is matched against the test's name rather than its message.
	OnName bool
	// Work is what fixing it takes.
	Work string
}

// classify returns the first cause whose pattern matches, or nil.
func classify(causes []Cause, name string, r Result) *Cause {
	for i := range causes {
		c := &causes[i]
		text := r.Message
		if c.OnName {
			text = name
		}
		if c.Pattern.MatchString(text) {
			return c
		}
	}
	return nil
}

// firstLine is a failure message's first meaningful line, shortened for a table cell.
func firstLine(msg string) string {
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "[FAILED]" {
			continue
		}
		l = strings.TrimPrefix(l, "[FAILED] ")
		if len(l) > 160 {
			l = l[:157] + "..."
		}
		return l
	}
	return ""
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "\n", " ")
	return s
}

// DocInput is what the page reports.
type DocInput struct {
	// Header is the Markdown before the tables: date, versions, command, what ran.
	Header string
	// Kubelet and Holdfast are the results by test name; Kubelet may be nil when it did not
	// run.
	Kubelet, Holdfast map[string]Result
	// Causes classify holdfast's failures.
	Causes []Cause
}

// counts returns passed, failed, skipped.
func counts(rs map[string]Result) (p, f, s int) {
	for _, r := range rs {
		switch r.State {
		case "passed":
			p++
		case "failed":
			f++
		default:
			s++
		}
	}
	return p, f, s
}

// WriteDoc writes docs/conformance.md.
func WriteDoc(w io.Writer, in DocInput) error {
	var b strings.Builder
	b.WriteString(in.Header)
	names := map[string]bool{}
	for n := range in.Holdfast {
		names[n] = true
	}
	for n := range in.Kubelet {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)

	state := func(rs map[string]Result, n string) string {
		if rs == nil {
			return "not run"
		}
		r, ok := rs[n]
		if !ok {
			return "not run"
		}
		return r.State
	}

	b.WriteString("\n## Totals\n\n| | passed | failed | skipped | total |\n|---|---:|---:|---:|---:|\n")
	for _, a := range []struct {
		name string
		rs   map[string]Result
	}{{"kubelet", in.Kubelet}, {"holdfast", in.Holdfast}} {
		if a.rs == nil {
			fmt.Fprintf(&b, "| %s | not run | | | |\n", a.name)
			continue
		}
		p, f, s := counts(a.rs)
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", a.name, p, f, s, len(a.rs))
	}
	both, onlyKubelet, onlyHoldfast := 0, 0, 0
	for _, n := range sorted {
		k, h := state(in.Kubelet, n), state(in.Holdfast, n)
		switch {
		case k == "passed" && h == "passed":
			both++
		case k == "passed":
			onlyKubelet++
		case h == "passed":
			onlyHoldfast++
		}
	}
	if in.Kubelet != nil {
		fmt.Fprintf(&b, "\nBoth pass %d tests; the kubelet passes %d that holdfast does not; holdfast passes %d that the kubelet does not.\n", both, onlyKubelet, onlyHoldfast)
	}

	// holdfast's failures by cause; those the kubelet fails too are the environment's.
	byCause := map[string][]string{}
	var unclassified, shared, exceptions []string
	for _, n := range sorted {
		r, ok := in.Holdfast[n]
		if !ok || r.State != "failed" {
			continue
		}
		switch k := state(in.Kubelet, n); {
		case k == "failed":
			shared = append(shared, n)
			continue
		case k == "passed":
			exceptions = append(exceptions, n)
		}
		if c := classify(in.Causes, n, r); c != nil {
			byCause[c.Name] = append(byCause[c.Name], n)
		} else {
			unclassified = append(unclassified, n)
		}
	}
	b.WriteString("\n## holdfast's failures by cause\n\n| cause | tests | the work it needs |\n|---|---:|---|\n")
	if len(shared) > 0 {
		fmt.Fprintf(&b, "| the kubelet fails them too | %d | none in holdfast: the harness's environment (an image not built here, a kernel module); each row below gives the message |\n", len(shared))
	}
	for _, c := range in.Causes {
		if len(byCause[c.Name]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", cell(c.Name), len(byCause[c.Name]), cell(c.Work))
	}
	if len(unclassified) > 0 {
		fmt.Fprintf(&b, "| other (see the row's message) | %d | |\n", len(unclassified))
	}

	// The exceptions: what the kubelet passes and holdfast does not, each with its reason.
	if in.Kubelet != nil {
		fmt.Fprintf(&b, "\n## Passed by the kubelet, failed by holdfast (%d)\n\n", len(exceptions))
		if len(exceptions) == 0 {
			b.WriteString("None: holdfast passes every test the kubelet passes in this run.\n")
		} else {
			b.WriteString("| test | cause | the work it needs |\n|---|---|---|\n")
		}
		for _, n := range exceptions {
			cause, work := "unexplained: "+firstLine(in.Holdfast[n].Message), ""
			if c := classify(in.Causes, n, in.Holdfast[n]); c != nil {
				cause, work = c.Name, c.Work
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", cell(n), cell(cause), cell(work))
		}
	}

	b.WriteString("\n## Every test\n\nThe reason is given for each holdfast failure or skip: the cause above, then the first line of the suite's message.\n\n| test | kubelet | holdfast | reason (holdfast) |\n|---|---|---|---|\n")
	for _, n := range sorted {
		k, h := state(in.Kubelet, n), state(in.Holdfast, n)
		reason := ""
		if r, ok := in.Holdfast[n]; ok && r.State != "passed" {
			reason = firstLine(r.Message)
			if r.State == "failed" {
				if c := classify(in.Causes, n, r); c != nil {
					reason = c.Name + ": " + reason
				}
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(n), k, h, cell(reason))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
