package stats

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"k8s.io/component-base/metrics"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// The kubelet's resource metrics (pkg/kubelet/metrics/collectors/resource_metrics.go): the
// same names, help, labels and stability, so metrics-server and dashboards read holdfast as
// they read a kubelet. Swap metrics are left out: holdfast runs pods without swap.
var (
	nodeCPUUsageDesc = metrics.NewDesc("node_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the node in core-seconds", nil, nil, metrics.STABLE, "")
	nodeMemoryUsageDesc = metrics.NewDesc("node_memory_working_set_bytes",
		"Current working set of the node in bytes", nil, nil, metrics.STABLE, "")
	containerCPUUsageDesc = metrics.NewDesc("container_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the container in core-seconds", []string{"container", "pod", "namespace"}, nil, metrics.STABLE, "")
	containerMemoryUsageDesc = metrics.NewDesc("container_memory_working_set_bytes",
		"Current working set of the container in bytes", []string{"container", "pod", "namespace"}, nil, metrics.STABLE, "")
	containerStartTimeDesc = metrics.NewDesc("container_start_time_seconds",
		"Start time of the container since unix epoch in seconds", []string{"container", "pod", "namespace"}, nil, metrics.STABLE, "")
	podCPUUsageDesc = metrics.NewDesc("pod_cpu_usage_seconds_total",
		"Cumulative cpu time consumed by the pod in core-seconds", []string{"pod", "namespace"}, nil, metrics.STABLE, "")
	podMemoryUsageDesc = metrics.NewDesc("pod_memory_working_set_bytes",
		"Current working set of the pod in bytes", []string{"pod", "namespace"}, nil, metrics.STABLE, "")
	resourceScrapeErrorDesc = metrics.NewDesc("resource_scrape_error",
		"1 if there was an error while getting container metrics, 0 otherwise", nil, nil, metrics.STABLE, "")
)

// ResourceMetricsHandler serves the resource metrics of a summary measured at each scrape.
func ResourceMetricsHandler(p *Provider, log *slog.Logger) http.Handler {
	r := metrics.NewKubeRegistry()
	r.CustomMustRegister(&resourceCollector{p: p, log: log})
	return metrics.HandlerFor(r, metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError})
}

type resourceCollector struct {
	metrics.BaseStableCollector
	p   *Provider
	log *slog.Logger
}

var _ metrics.StableCollector = &resourceCollector{}

func (rc *resourceCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{nodeCPUUsageDesc, nodeMemoryUsageDesc, containerStartTimeDesc, containerCPUUsageDesc,
		containerMemoryUsageDesc, podCPUUsageDesc, podMemoryUsageDesc, resourceScrapeErrorDesc} {
		ch <- d
	}
}

// CollectWithStability measures a summary; only what runs now is reported, so a gone container
// leaves no series behind.
func (rc *resourceCollector) CollectWithStability(ch chan<- metrics.Metric) {
	s, err := rc.p.Summary(context.Background())
	scrapeError := 0.0
	if err != nil {
		rc.log.Warn("measure resource metrics", "err", err)
		scrapeError = 1
	}
	ch <- metrics.NewLazyConstMetric(resourceScrapeErrorDesc, metrics.GaugeValue, scrapeError)
	if err != nil {
		return
	}
	emitCPU(ch, nodeCPUUsageDesc, s.Node.CPU)
	emitMemory(ch, nodeMemoryUsageDesc, s.Node.Memory)
	for _, pod := range s.Pods {
		for _, c := range pod.Containers {
			ch <- metrics.NewLazyConstMetric(containerStartTimeDesc, metrics.GaugeValue, float64(c.StartTime.UnixNano())/float64(time.Second),
				c.Name, pod.PodRef.Name, pod.PodRef.Namespace)
			emitCPU(ch, containerCPUUsageDesc, c.CPU, c.Name, pod.PodRef.Name, pod.PodRef.Namespace)
			emitMemory(ch, containerMemoryUsageDesc, c.Memory, c.Name, pod.PodRef.Name, pod.PodRef.Namespace)
		}
		emitCPU(ch, podCPUUsageDesc, pod.CPU, pod.PodRef.Name, pod.PodRef.Namespace)
		emitMemory(ch, podMemoryUsageDesc, pod.Memory, pod.PodRef.Name, pod.PodRef.Namespace)
	}
}

func emitCPU(ch chan<- metrics.Metric, d *metrics.Desc, s *statsapi.CPUStats, labels ...string) {
	if s == nil || s.UsageCoreNanoSeconds == nil {
		return
	}
	ch <- metrics.NewLazyMetricWithTimestamp(s.Time.Time,
		metrics.NewLazyConstMetric(d, metrics.CounterValue, float64(*s.UsageCoreNanoSeconds)/float64(time.Second), labels...))
}

func emitMemory(ch chan<- metrics.Metric, d *metrics.Desc, s *statsapi.MemoryStats, labels ...string) {
	if s == nil || s.WorkingSetBytes == nil {
		return
	}
	ch <- metrics.NewLazyMetricWithTimestamp(s.Time.Time,
		metrics.NewLazyConstMetric(d, metrics.GaugeValue, float64(*s.WorkingSetBytes), labels...))
}
