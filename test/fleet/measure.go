package fleet

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"

	"github.com/holdfast-dev/holdfast/internal/procfs"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// sampleEvery is how often resident sets are sampled during a window.
const sampleEvery = 5 * time.Second

// meter measures one control plane.
type meter struct {
	cp    *testenv.ControlPlane
	admin kubernetes.Interface
}

// measure watches the control plane for window: CPU from /proc at both ends, resident sets
// sampled, request counts from the apiserver's /metrics at both ends. agentPids, if not nil,
// are the agents' processes, whose resident sets are summed.
func (m *meter) measure(ctx context.Context, window time.Duration, agentPids func() []int) (Usage, error) {
	apiPid, etcdPid := m.cp.APIServerPid(), m.cp.EtcdPid()
	before, err := m.requests(ctx)
	if err != nil {
		return Usage{}, err
	}
	api0, err1 := procfs.ReadProcess(apiPid, false)
	etcd0, err2 := procfs.ReadProcess(etcdPid, false)
	if err1 != nil || err2 != nil {
		return Usage{}, fmt.Errorf("read the control plane's CPU: %v, %v", err1, err2)
	}
	start := time.Now()

	var api, etcd, agents series
	sample := func() {
		api.add(procfs.RSS(apiPid))
		etcd.add(procfs.RSS(etcdPid))
		if agentPids != nil {
			var sum uint64
			for _, pid := range agentPids() {
				sum += procfs.RSS(pid)
			}
			agents.add(sum)
		}
	}
	sample()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	end := time.NewTimer(window)
	defer end.Stop()
wait:
	for {
		select {
		case <-tick.C:
			sample()
		case <-end.C:
			break wait
		case <-ctx.Done():
			return Usage{}, ctx.Err()
		}
	}
	sample()

	api1, err1 := procfs.ReadProcess(apiPid, false)
	etcd1, err2 := procfs.ReadProcess(etcdPid, false)
	if err1 != nil || err2 != nil {
		return Usage{}, fmt.Errorf("read the control plane's CPU: %v, %v", err1, err2)
	}
	secs := time.Since(start).Seconds()
	after, err := m.requests(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{
		Seconds:            secs,
		APIServerCores:     (api1.CPUSeconds() - api0.CPUSeconds()) / secs,
		EtcdCores:          (etcd1.CPUSeconds() - etcd0.CPUSeconds()) / secs,
		APIServerRSSMiB:    api.meanMiB(),
		APIServerRSSMaxMiB: api.maxMiB(),
		EtcdRSSMiB:         etcd.meanMiB(),
		EtcdRSSMaxMiB:      etcd.maxMiB(),
		AgentsRSSMiB:       agents.meanMiB(),
		RequestsPerMinute:  map[string]float64{},
	}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			u.RequestsPerMinute[k] = d / secs * 60
		}
	}
	return u, nil
}

// requests reads the apiserver's apiserver_request_total, summed by verb, resource and
// subresource over the other labels (code, scope, group, version...). Non-resource requests
// (/metrics, /healthz...) are left out: the harness's own scrapes are among them.
func (m *meter) requests(ctx context.Context) (map[string]float64, error) {
	b, err := m.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape the apiserver's /metrics: %w", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("parse the apiserver's /metrics: %w", err)
	}
	out := map[string]float64{}
	fam := families["apiserver_request_total"]
	if fam == nil {
		return nil, fmt.Errorf("the apiserver's /metrics has no apiserver_request_total")
	}
	for _, metric := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range metric.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["resource"] == "" {
			continue
		}
		key := labels["verb"] + " " + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += metric.GetCounter().GetValue()
	}
	return out, nil
}

// series is samples of a resident set.
type series struct{ samples []uint64 }

func (s *series) add(v uint64) {
	if v > 0 {
		s.samples = append(s.samples, v)
	}
}

func (s *series) meanMiB() float64 {
	if len(s.samples) == 0 {
		return 0
	}
	var sum float64
	for _, v := range s.samples {
		sum += float64(v)
	}
	return sum / float64(len(s.samples)) / (1 << 20)
}

func (s *series) maxMiB() float64 {
	var m uint64
	for _, v := range s.samples {
		m = max(m, v)
	}
	return float64(m) / (1 << 20)
}
