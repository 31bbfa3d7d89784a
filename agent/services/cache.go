package services

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/holdfast-dev/holdfast/agent/kube"
	"github.com/holdfast-dev/holdfast/internal/fsutil"
)

// ErrNotSynced is the kubelet's error for a pod from the API whose env is built before services
// were ever read: its container waits (CreateContainerConfigError) and is retried.
var ErrNotSynced = errors.New("services have not yet been read at least once, cannot construct envvars")

// saveInterval bounds how often the last known services are written: services change rarely,
// flash wears out.
const saveInterval = 10 * time.Second

// Cache knows the cluster's services: from an informer while the apiserver answers, from the
// file the informer's last view was saved to before that.
type Cache struct {
	client kube.Interface
	path   string
	log    *slog.Logger

	mu       sync.Mutex // protects services, known, dirty
	services map[string]*v1.Service
	// known: services were read at least once, from the apiserver or the saved file.
	known bool
	dirty bool // changed since last saved

	// onKnown runs once when services are first read from the apiserver: pods that waited
	// with ErrNotSynced are synced again at once rather than on their next resync, which
	// may come after a short activeDeadlineSeconds or a startup probe's budget.
	onKnown func()
}

// OnKnown sets what runs once the apiserver's services were first read. Set it before Run.
func (c *Cache) OnKnown(f func()) { c.onKnown = f }

// NewCache returns a cache that starts with the services saved under stateDir, if any. A nil
// client is a standalone agent: no services, no variables, as with a kubelet without apiserver.
func NewCache(client kube.Interface, stateDir string, log *slog.Logger) *Cache {
	c := &Cache{client: client, path: filepath.Join(stateDir, "services.json"), log: log, services: map[string]*v1.Service{}}
	if client == nil {
		return c
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return c
	}
	var saved []*v1.Service
	if err := json.Unmarshal(b, &saved); err != nil {
		log.Warn("last known services unreadable; waiting for the apiserver's", "path", c.path, "err", err)
		return c
	}
	for _, s := range saved {
		c.services[s.Namespace+"/"+s.Name] = s
	}
	c.known = true
	return c
}

// EnvVars returns the service variables of a pod (see EnvVars). Before services were ever
// read it returns ErrNotSynced for API pods; static pods run without waiting, as with the
// kubelet.
func (c *Cache) EnvVars(pod *v1.Pod, static bool) (map[string]string, error) {
	if c.client == nil {
		return nil, nil
	}
	c.mu.Lock()
	known := c.known
	list := make([]*v1.Service, 0, len(c.services))
	for _, s := range c.services {
		list = append(list, s)
	}
	c.mu.Unlock()
	if !known && !static {
		return nil, ErrNotSynced
	}
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	return EnvVars(list, pod.Namespace, links), nil
}

// Run watches services until ctx ends, saving what it sees.
func (c *Cache) Run(ctx context.Context) error {
	if c.client == nil {
		return nil
	}
	inf := kube.NewInformer(c.client.CoreV1().Services(metav1.NamespaceAll), c.client, &v1.Service{}, nil)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.put(obj) },
		UpdateFunc: func(_, obj any) { c.put(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*v1.Service); ok {
				c.mu.Lock()
				delete(c.services, s.Namespace+"/"+s.Name)
				c.dirty = true
				c.mu.Unlock()
			}
		},
	})
	inf.Start(ctx.Done())
	defer inf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	// The informer's complete list replaces what was saved: services deleted meanwhile go.
	c.mu.Lock()
	c.services = map[string]*v1.Service{}
	for _, obj := range inf.GetStore().List() {
		if s, ok := obj.(*v1.Service); ok {
			c.services[s.Namespace+"/"+s.Name] = slim(s)
		}
	}
	wasKnown := c.known
	c.known, c.dirty = true, true
	c.mu.Unlock()
	c.save()
	if !wasKnown && c.onKnown != nil {
		c.onKnown()
	}
	ticker := time.NewTicker(saveInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			c.save()
			return nil
		case <-ticker.C:
			c.save()
		}
	}
}

func (c *Cache) put(obj any) {
	s, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services[s.Namespace+"/"+s.Name] = slim(s)
	c.dirty = true
}

// save writes the services when they changed since the last save.
func (c *Cache) save() {
	c.mu.Lock()
	if !c.dirty {
		c.mu.Unlock()
		return
	}
	list := make([]*v1.Service, 0, len(c.services))
	for _, s := range c.services {
		list = append(list, s)
	}
	c.dirty = false
	c.mu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		return list[i].Namespace+"/"+list[i].Name < list[j].Namespace+"/"+list[j].Name
	})
	if err := fsutil.WriteJSONAtomic(c.path, list); err != nil {
		c.log.Warn("save last known services", "path", c.path, "err", err)
		c.mu.Lock()
		c.dirty = true
		c.mu.Unlock()
	}
}

// slim keeps what the variables are made of.
func slim(s *v1.Service) *v1.Service {
	out := &v1.Service{}
	out.Namespace, out.Name = s.Namespace, s.Name
	out.Spec.ClusterIP = s.Spec.ClusterIP
	out.Spec.Ports = append([]v1.ServicePort(nil), s.Spec.Ports...)
	return out
}
