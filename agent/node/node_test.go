package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// A node that is not ready at its first status (the runtime not relisted yet) is reported
// Ready as soon as it is, not a whole update period later.
func TestReadyReportedWithoutWaitingForTheNextUpdate(t *testing.T) {
	client := fake.NewClientset()
	var relisted atomic.Bool
	readiness := func() error {
		if !relisted.Load() {
			return errors.New("runtime not relisted yet")
		}
		return nil
	}
	version := func(context.Context) (string, error) { return "containerd://test", nil }
	c := NewController(Config{
		NodeName:        "gw-unit",
		MaxPods:         10,
		StorageDir:      t.TempDir(),
		LeaseDuration:   40 * time.Second,
		RenewInterval:   10 * time.Second,
		UpdateFrequency: time.Hour, // never within this test
		ReportFrequency: time.Hour,
	}, kubetest.Wrap(client), version, readiness, slog.New(slog.NewTextHandler(io.Discard, nil)))

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	readyCondition := func() (v1.NodeCondition, error) {
		node, err := client.CoreV1().Nodes().Get(ctx, "gw-unit", metav1.GetOptions{})
		if err != nil {
			return v1.NodeCondition{}, err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == v1.NodeReady {
				return cond, nil
			}
		}
		return v1.NodeCondition{}, errors.New("no Ready condition yet")
	}
	testenv.Eventually(t, 30*time.Second, "the first status, not ready", func() error {
		cond, err := readyCondition()
		if err != nil {
			return err
		}
		if cond.Status != v1.ConditionFalse || cond.Message != "runtime not relisted yet" {
			return errors.New("Ready is " + string(cond.Status) + ": " + cond.Message)
		}
		return nil
	})
	relisted.Store(true)
	testenv.Eventually(t, 30*time.Second, "Ready reported", func() error {
		cond, err := readyCondition()
		if err != nil {
			return err
		}
		if cond.Status != v1.ConditionTrue || cond.Reason != "KubeletReady" {
			return errors.New("Ready is " + string(cond.Status) + ": " + cond.Message)
		}
		return nil
	})
}

// Allocatable is the capacity less what is reserved, floored at zero; what is not reserved
// stays the capacity.
func TestAllocatable(t *testing.T) {
	capacity := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("2"),
		v1.ResourceMemory:           resource.MustParse("4Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
		v1.ResourcePods:             resource.MustParse("110"),
	}
	reserved := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("250m"),
		v1.ResourceMemory:           resource.MustParse("612Mi"), // systemReserved + kubeReserved + memory.available
		v1.ResourceEphemeralStorage: resource.MustParse("20Gi"),  // more than there is
	}
	got := Allocatable(capacity, reserved)
	want := map[v1.ResourceName]string{v1.ResourceCPU: "1750m", v1.ResourceMemory: "3484Mi", v1.ResourceEphemeralStorage: "0", v1.ResourcePods: "110"}
	for name, w := range want {
		q := got[name]
		if q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("allocatable %s = %s, want %s", name, &q, w)
		}
	}
	if c := capacity[v1.ResourceMemory]; c.Value() != 4<<30 {
		t.Errorf("capacity changed: %s", &c)
	}
}
