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

// Cause is a class of failures, told by the failure's message.
type Cause struct {
	// Name is the short label used in the tables.
	Name string
	// Pattern matches the failure's message.
	Pattern *regexp.Regexp
	// Means is what the message shows, and where to look.
	Means string
}

// classify returns the first cause whose pattern matches the failure's message, or nil.
func classify(causes []Cause, r Result) *Cause {
	for i := range causes {
		if causes[i].Pattern.MatchString(r.Message) {
			return &causes[i]
		}
	}
	return nil
}

// bareTimeout is a first line that says only that gomega stopped waiting: the next line says
// what for.
var bareTimeout = regexp.MustCompile(`^(Told to stop trying|Timed out) after [0-9.]+s\.$`)

// firstLine is a failure message's first meaningful line (with the next one when it says only
// that the wait stopped), shortened for a table cell.
func firstLine(msg string) string {
	var out []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || l == "[FAILED]" {
			continue
		}
		out = append(out, strings.TrimPrefix(l, "[FAILED] "))
		if len(out) > 1 || !bareTimeout.MatchString(out[0]) {
			break
		}
	}
	l := strings.Join(out, " ")
	if len(l) > 160 {
		l = l[:157] + "..."
	}
	return l
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
	// Causes classify the failures by their message.
	Causes []Cause
	// Later are the focused runs kept beside the page that started after this run: a test
	// this run failed that an agent passed in one is said to have passed there, with the link.
	Later []KeptRun
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

// reason is a failure's or skip's cause and the first line of its message.
func reason(causes []Cause, r Result, ok bool) string {
	if !ok || r.State == "passed" {
		return ""
	}
	line := firstLine(r.Message)
	if r.State == "failed" {
		if c := classify(causes, r); c != nil {
			return c.Name + ": " + line
		}
		return "other: " + line
	}
	return line
}

// passedLater returns the first later kept run in which agent passed test n.
func passedLater(later []KeptRun, agent, n string) *KeptRun {
	for i := range later {
		if r, ok := later[i].Results[agent][n]; ok && r.State == "passed" {
			return &later[i]
		}
	}
	return nil
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
	agents := []struct {
		name string
		rs   map[string]Result
	}{{Kubelet, in.Kubelet}, {Holdfast, in.Holdfast}}

	b.WriteString("\n## Totals\n\n| | passed | failed | skipped | total | seconds in tests |\n|---|---:|---:|---:|---:|---:|\n")
	for _, a := range agents {
		if a.rs == nil {
			fmt.Fprintf(&b, "| %s | not run | | | | |\n", a.name)
			continue
		}
		p, f, s := counts(a.rs)
		secs := 0.0
		for _, r := range a.rs {
			secs += r.Seconds
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.0f |\n", a.name, p, f, s, len(a.rs), secs)
	}
	both, onlyKubelet, onlyHoldfast, bothFail := 0, 0, 0, 0
	for _, n := range sorted {
		k, h := state(in.Kubelet, n), state(in.Holdfast, n)
		switch {
		case k == "passed" && h == "passed":
			both++
		case k == "passed":
			onlyKubelet++
		case h == "passed":
			onlyHoldfast++
		case k == "failed" && h == "failed":
			bothFail++
		}
	}
	if in.Kubelet != nil && in.Holdfast != nil {
		fmt.Fprintf(&b, "\nBoth pass %d tests and both fail %d; the kubelet passes %d that holdfast does not; holdfast passes %d that the kubelet does not.\n", both, bothFail, onlyKubelet, onlyHoldfast)
	}

	// Every failure by the cause its message shows, for each agent.
	b.WriteString("\n## Failures by cause\n\nEach failure is classified by its message alone (test/conformance/causes.go), whichever agent failed it.\n\n| cause | kubelet | holdfast | of them failed by both | what the message shows |\n|---|---:|---:|---:|---|\n")
	type tally struct{ k, h, both int }
	byCause := map[string]*tally{}
	for _, n := range sorted {
		kr, kok := in.Kubelet[n]
		hr, hok := in.Holdfast[n]
		kc, hc := "", ""
		if kok && kr.State == "failed" {
			kc = "other"
			if c := classify(in.Causes, kr); c != nil {
				kc = c.Name
			}
		}
		if hok && hr.State == "failed" {
			hc = "other"
			if c := classify(in.Causes, hr); c != nil {
				hc = c.Name
			}
		}
		for _, c := range []string{kc, hc} {
			if c != "" && byCause[c] == nil {
				byCause[c] = &tally{}
			}
		}
		if kc != "" {
			byCause[kc].k++
		}
		if hc != "" {
			byCause[hc].h++
		}
		if kc != "" && kc == hc {
			byCause[kc].both++
		}
	}
	for _, c := range append(in.Causes, Cause{Name: "other", Means: "no cause matches the message: see the row's message below"}) {
		t := byCause[c.Name]
		if t == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", cell(c.Name), t.k, t.h, t.both, cell(c.Means))
	}
	if len(byCause) == 0 {
		b.WriteString("| none | 0 | 0 | 0 | |\n")
	}

	// What the kubelet passes and holdfast does not, each with its message.
	if in.Kubelet != nil && in.Holdfast != nil {
		fmt.Fprintf(&b, "\n## Passed by the kubelet, failed by holdfast (%d)\n\n", onlyKubelet)
		if onlyKubelet == 0 {
			b.WriteString("None: holdfast passes every test the kubelet passes in this run.\n")
		} else {
			b.WriteString("| test | holdfast's failure |\n|---|---|\n")
		}
		for _, n := range sorted {
			if state(in.Kubelet, n) == "passed" && state(in.Holdfast, n) != "passed" {
				r, ok := in.Holdfast[n]
				fmt.Fprintf(&b, "| %s | %s |\n", cell(n), cell(reason(in.Causes, r, ok)))
			}
		}
	}

	// Tests failed here and passed in a focused run kept beside the page, after this one.
	type fixed struct{ test, agent string }
	var later []fixed
	for _, n := range sorted {
		for _, a := range agents {
			if state(a.rs, n) == "failed" && passedLater(in.Later, a.name, n) != nil {
				later = append(later, fixed{n, a.name})
			}
		}
	}
	if len(later) > 0 {
		b.WriteString("\n## Failed in this run, passed in a later focused run\n\nFrom the focused runs the harness made after this one and kept beside this page.\n\n| test | agent | the focused run |\n|---|---|---|\n")
		for _, f := range later {
			k := passedLater(in.Later, f.agent, f.test)
			fmt.Fprintf(&b, "| %s | %s | [%s](%s) (started %s, commit %s) |\n", cell(f.test), f.agent, k.Name, k.Page, k.Started, k.Commit)
		}
	}

	b.WriteString("\n## Every test\n\nThe reason is given for each failure or skip: the cause its message shows (or \"other\"), then the message's first line.\n\n| test | kubelet | holdfast | reason (kubelet) | reason (holdfast) |\n|---|---|---|---|---|\n")
	for _, n := range sorted {
		kr, kok := in.Kubelet[n]
		hr, hok := in.Holdfast[n]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", cell(n), state(in.Kubelet, n), state(in.Holdfast, n),
			cell(reason(in.Causes, kr, kok)), cell(reason(in.Causes, hr, hok)))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
