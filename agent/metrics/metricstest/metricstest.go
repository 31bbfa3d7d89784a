// Package metricstest reads a /metrics exposition as a scraper does, with Prometheus' own text
// parser, for tests of the parts that record metrics and of the agent that serves them.
package metricstest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Parse parses the Prometheus text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	f, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return f, nil
}

// Scrape gets /metrics from h and parses it.
func Scrape(t testing.TB, h http.Handler) Families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	f, err := Parse(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Value sums the values of the family's series that have the labels (name, value pairs): a
// counter's or gauge's value, a histogram's sample count. ok is false when no series matches.
func (f Families) Value(name string, labels ...string) (sum float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, s := range fam.Metric {
		if !hasLabels(s, labels) {
			continue
		}
		ok = true
		switch {
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Untyped != nil:
			sum += s.Untyped.GetValue()
		case s.Histogram != nil:
			sum += float64(s.Histogram.GetSampleCount())
		}
	}
	return sum, ok
}

// Sum adds up the sample sums of the family's histogram series that have the labels (name,
// value pairs). ok is false when no histogram series matches.
func (f Families) Sum(name string, labels ...string) (sum float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, s := range fam.Metric {
		if s.Histogram != nil && hasLabels(s, labels) {
			ok = true
			sum += s.Histogram.GetSampleSum()
		}
	}
	return sum, ok
}

func hasLabels(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range s.Label {
			found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}
