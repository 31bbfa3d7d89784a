// Package status owns what is reported about pods: it keeps the latest status the pod
// workers computed, writes it to the apiserver through the status subresource when it
// changed (one patch per change, however many syncs computed it), and deletes an API pod for
// good once its containers are gone.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"

	"github.com/holdfast-dev/holdfast/agent/manifest"
)

// Manager keeps and reports pod statuses. With a nil client it only keeps them (standalone).
type Manager struct {
	client kubernetes.Interface
	log    *slog.Logger
	wake   chan struct{} // buffered(1)

	mu   sync.Mutex // protects pods
	pods map[types.UID]*entry
}

type entry struct {
	pod       *v1.Pod // latest pod object the worker had (for name, namespace, source)
	status    v1.PodStatus
	sent      *v1.PodStatus // last status the apiserver accepted; nil until the first write
	dirty     bool
	terminate bool // containers gone: delete the API object after the final status
	deleted   bool
}

// NewManager builds a manager; Run writes to the apiserver.
func NewManager(client kubernetes.Interface, log *slog.Logger) *Manager {
	return &Manager{client: client, log: log, wake: make(chan struct{}, 1), pods: map[types.UID]*entry{}}
}

// SetPodStatus records a pod's latest computed status. An unchanged status is a no-op.
func (m *Manager) SetPodStatus(pod *v1.Pod, st v1.PodStatus) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[pod.UID]
	if !ok {
		e = &entry{}
		m.pods[pod.UID] = e
		if reportable(pod) {
			base := pod.Status
			e.sent = &base
		}
	}
	e.pod = pod
	if ok && apiequality.Semantic.DeepEqual(e.status, st) {
		return
	}
	m.logChange(pod, e.status, st, !ok)
	e.status = st
	e.dirty = true
	m.poke()
}

// PodTerminated marks the pod's teardown as complete.
func (m *Manager) PodTerminated(pod *v1.Pod) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[pod.UID]
	if !ok {
		return
	}
	e.pod = pod
	e.terminate = true
	e.dirty = true
	m.poke()
}

// Get returns the latest status of a pod.
func (m *Manager) Get(uid types.UID) (v1.PodStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.pods[uid]
	if !ok {
		return v1.PodStatus{}, false
	}
	return e.status, true
}

// PodView is one pod as the local /pods endpoint shows it.
type PodView struct {
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	UID       types.UID    `json:"uid"`
	Source    string       `json:"source"`
	Status    v1.PodStatus `json:"status"`
}

// List returns every pod the manager knows, sorted by namespace and name.
func (m *Manager) List() []PodView {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PodView, 0, len(m.pods))
	for uid, e := range m.pods {
		src := manifest.SourceAPI
		if manifest.IsStatic(e.pod) {
			src = manifest.SourceFile
		}
		out = append(out, PodView{Namespace: e.pod.Namespace, Name: e.pod.Name, UID: uid, Source: src, Status: e.status})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// reportable: the pod exists in the apiserver (static pods get mirror pods in a later step).
func reportable(pod *v1.Pod) bool { return !manifest.IsStatic(pod) }

// Run writes dirty statuses until ctx ends. A failed write stays dirty and is retried.
func (m *Manager) Run(ctx context.Context) error {
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.wake:
		case <-ticker.C:
		}
		m.syncAll(ctx)
	}
}

func (m *Manager) syncAll(ctx context.Context) {
	type job struct {
		uid  types.UID
		pod  *v1.Pod
		st   v1.PodStatus
		sent *v1.PodStatus
		term bool
	}
	var jobs []job
	m.mu.Lock()
	for uid, e := range m.pods {
		if !e.dirty {
			continue
		}
		if !reportable(e.pod) || m.client == nil {
			e.dirty = false
			if e.terminate {
				delete(m.pods, uid)
			}
			continue
		}
		jobs = append(jobs, job{uid, e.pod, e.status, e.sent, e.terminate})
	}
	m.mu.Unlock()

	for _, j := range jobs {
		sent, err := m.patch(ctx, j.pod, j.sent, j.st)
		if err == nil && j.term && j.pod.DeletionTimestamp != nil {
			err = m.delete(ctx, j.pod)
		}
		m.mu.Lock()
		e := m.pods[j.uid]
		if e != nil {
			if sent != nil {
				e.sent = sent
			}
			if err == nil && apiequality.Semantic.DeepEqual(e.status, j.st) && e.terminate == j.term {
				e.dirty = false
				if e.terminate {
					delete(m.pods, j.uid)
				}
			}
		}
		m.mu.Unlock()
		if err != nil {
			m.log.Warn("report pod status", "pod", j.pod.Namespace+"/"+j.pod.Name, "err", err)
		}
	}
}

// patch writes st with a strategic merge patch computed from the last status the apiserver
// accepted, with the pod UID as a precondition so a re-created pod of the same name is never
// patched with another pod's status.
func (m *Manager) patch(ctx context.Context, pod *v1.Pod, sent *v1.PodStatus, st v1.PodStatus) (*v1.PodStatus, error) {
	if sent != nil && apiequality.Semantic.DeepEqual(*sent, st) {
		return sent, nil
	}
	var base v1.PodStatus
	if sent != nil {
		base = *sent
	}
	oldJSON, err := json.Marshal(v1.Pod{Status: base})
	if err != nil {
		return nil, err
	}
	newJSON, err := json.Marshal(v1.Pod{Status: st})
	if err != nil {
		return nil, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, v1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("compute status patch: %w", err)
	}
	var body map[string]any
	if err := json.Unmarshal(patch, &body); err != nil {
		return nil, err
	}
	body["metadata"] = map[string]any{"uid": string(pod.UID)}
	if patch, err = json.Marshal(body); err != nil {
		return nil, err
	}
	updated, err := m.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil, nil // gone or replaced: nothing to report any more
	}
	if err != nil {
		return nil, fmt.Errorf("patch status of %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return &updated.Status, nil
}

// delete removes the API object with grace period 0 once the pod's containers are gone, as
// kubelet does to finish a graceful deletion.
func (m *Manager) delete(ctx context.Context, pod *v1.Pod) error {
	zero := int64(0)
	err := m.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// logChange writes one line when a pod's phase or a container's state changes, so that an
// operator following the log sees the pods move.
func (m *Manager) logChange(pod *v1.Pod, old, cur v1.PodStatus, first bool) {
	o, c := summary(old), summary(cur)
	if !first && o == c && old.Phase == cur.Phase {
		return
	}
	m.log.Info("pod status", "pod", pod.Namespace+"/"+pod.Name, "phase", cur.Phase, "podIP", cur.PodIP, "containers", c)
}

func summary(st v1.PodStatus) string {
	parts := make([]string, 0, len(st.ContainerStatuses))
	for _, cs := range st.ContainerStatuses {
		s := cs.Name + "="
		switch {
		case cs.State.Running != nil:
			s += "running"
		case cs.State.Terminated != nil:
			s += fmt.Sprintf("terminated(%s, exit %d)", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		case cs.State.Waiting != nil:
			s += "waiting(" + cs.State.Waiting.Reason + ")"
		}
		if cs.Ready {
			s += ",ready"
		}
		if cs.RestartCount > 0 {
			s += fmt.Sprintf(",restarts=%d", cs.RestartCount)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}
