package pods

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/holdfast-dev/holdfast/agent/volumes"
	"github.com/holdfast-dev/holdfast/internal/expansion"
)

// errConfig marks a container whose configuration cannot be resolved; its waiting reason is
// CreateContainerConfigError, as kubelet reports it.
type errConfig struct {
	msg   string
	cause error // what the worker must know about it (errWaitingForServices), if anything
}

func (e *errConfig) Error() string { return e.msg }
func (e *errConfig) Unwrap() error { return e.cause }

// EnvSource is where env values that live outside the pod spec come from: ConfigMaps and
// Secrets read with the node's identity, and the node's allocatable resources (the limits
// resourceFieldRef reports for a container without its own). *volumes.Manager implements it,
// so that env and volumes share one node-scoped, watched cache. A missing object is an error
// for which apierrors.IsNotFound holds.
type EnvSource interface {
	ConfigMap(ctx context.Context, pod *v1.Pod, name string) (*v1.ConfigMap, error)
	Secret(ctx context.Context, pod *v1.Pod, name string) (*v1.Secret, error)
	Allocatable() v1.ResourceList
}

var _ EnvSource = (*volumes.Manager)(nil)

// envInput is what a container's env is resolved from.
type envInput struct {
	pod       *v1.Pod
	container *v1.Container
	podIPs    []string
	hostIPs   []string
	// source fetches ConfigMaps and Secrets; nil means there is none (references to them are
	// then config errors).
	source EnvSource
	// warn records a Warning event on the pod; may be nil.
	warn func(reason, message string)
	// services are the pod's service link variables (KUBERNETES_SERVICE_HOST, ...): a $(VAR)
	// may name them, and they are added after the container's own, which win.
	services map[string]string
}

// resolveEnv resolves a container's environment as kubelet does: envFrom sources first (in
// order, keys sorted, each with its prefix), then env in order, a later definition replacing an
// earlier one in place. Literal values expand $(VAR) references to variables defined before,
// envFrom's included; values from valueFrom are taken as they are. An optional reference to a
// missing ConfigMap, Secret or key leaves the variable out. Anything else that cannot be
// resolved is an errConfig worded as kubelet words it (`secret "x" not found`). It returns the
// KEY=VALUE list and the variables by name (for expanding command and args).
func resolveEnv(ctx context.Context, in envInput) ([]string, map[string]string, error) {
	var env orderedEnv
	r := &envResolver{in: in, configMaps: map[string]*v1.ConfigMap{}, secrets: map[string]*v1.Secret{}}
	c := in.container
	for _, ef := range c.EnvFrom {
		if err := r.envFrom(ctx, ef, &env); err != nil {
			return nil, nil, err
		}
	}
	// Literal values expand the variables defined before them, then the service variables
	// (the kubelet's MappingFuncFor(tmpEnv, serviceEnv)).
	lookup := maps.Clone(in.services)
	if lookup == nil {
		lookup = map[string]string{}
	}
	maps.Copy(lookup, env.vars)
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil && e.Value == "" {
			v, ok, err := r.valueFrom(ctx, e)
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				continue
			}
			val = v
		} else {
			val = expansion.Expand(val, lookup)
		}
		env.set(e.Name, val)
		lookup[e.Name] = val
	}
	for _, name := range slices.Sorted(maps.Keys(in.services)) {
		if _, defined := env.vars[name]; !defined {
			env.set(name, in.services[name])
		}
	}
	return env.list(), env.vars, nil
}

// orderedEnv is a set of variables that keeps the order of first definition.
type orderedEnv struct {
	names []string
	vars  map[string]string
}

func (o *orderedEnv) set(name, val string) {
	if o.vars == nil {
		o.vars = map[string]string{}
	}
	if _, ok := o.vars[name]; !ok {
		o.names = append(o.names, name)
	}
	o.vars[name] = val
}

func (o *orderedEnv) list() []string {
	out := make([]string, len(o.names))
	for i, n := range o.names {
		out[i] = n + "=" + o.vars[n]
	}
	return out
}

// envResolver resolves one container's env, reading each ConfigMap and Secret once.
type envResolver struct {
	in         envInput
	configMaps map[string]*v1.ConfigMap
	secrets    map[string]*v1.Secret
}

func (r *envResolver) envFrom(ctx context.Context, ef v1.EnvFromSource, env *orderedEnv) error {
	var data map[string]string
	var what, name string
	switch {
	case ef.ConfigMapRef != nil:
		what, name = "configMap", ef.ConfigMapRef.Name
		cm, ok, err := r.configMap(ctx, name, ef.ConfigMapRef.Optional)
		if err != nil || !ok {
			return err
		}
		data = cm.Data
	case ef.SecretRef != nil:
		what, name = "secret", ef.SecretRef.Name
		s, ok, err := r.secret(ctx, name, ef.SecretRef.Optional)
		if err != nil || !ok {
			return err
		}
		data = make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			data[k] = string(v)
		}
	default:
		return &errConfig{msg: fmt.Sprintf("container %q: envFrom entry names neither a configMap nor a secret", r.in.container.Name)}
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var invalid []string
	for _, k := range keys {
		name := ef.Prefix + k
		// The rule the API applies to env names since 1.34 (printable ASCII, no '='): what
		// passes cannot corrupt the KEY=VALUE list.
		if errs := validation.IsRelaxedEnvVarName(name); len(errs) > 0 {
			invalid = append(invalid, name)
			continue
		}
		env.set(name, data[k])
	}
	if len(invalid) > 0 && r.in.warn != nil {
		r.in.warn("InvalidEnvironmentVariableNames", fmt.Sprintf(
			"Keys [%s] from the EnvFrom %s %s/%s were skipped since they are considered invalid environment variable names.",
			strings.Join(invalid, ", "), what, r.in.pod.Namespace, name))
	}
	return nil
}

// valueFrom resolves one env valueFrom; ok is false when an optional reference is missing.
func (r *envResolver) valueFrom(ctx context.Context, e v1.EnvVar) (string, bool, error) {
	in := r.in
	src := e.ValueFrom
	switch {
	case src.FieldRef != nil:
		v, err := fieldRefValue(in, e.Name, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		var allocatable v1.ResourceList
		if in.source != nil {
			allocatable = in.source.Allocatable()
		}
		v, err := volumes.ResourceFieldValue(src.ResourceFieldRef, in.pod, in.container, allocatable)
		if err != nil {
			return "", false, &errConfig{msg: fmt.Sprintf("container %q: env %q: %v", in.container.Name, e.Name, err)}
		}
		return v, true, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, ok, err := r.configMap(ctx, ref.Name, ref.Optional)
		if err != nil || !ok {
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &errConfig{msg: fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, in.pod.Namespace, ref.Name)}
		}
		return v, true, nil
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, ok, err := r.secret(ctx, ref.Name, ref.Optional)
		if err != nil || !ok {
			return "", false, err
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if isTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, &errConfig{msg: fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, in.pod.Namespace, ref.Name)}
		}
		return string(v), true, nil
	case src.FileKeyRef != nil:
		return "", false, &errConfig{msg: fmt.Sprintf("container %q: env %q: fileKeyRef is not supported by holdfast", in.container.Name, e.Name)}
	}
	return "", false, &errConfig{msg: fmt.Sprintf("container %q: env %q: valueFrom names no source", in.container.Name, e.Name)}
}

// configMap reads a ConfigMap once per container; ok is false when it is missing and optional.
func (r *envResolver) configMap(ctx context.Context, name string, optional *bool) (*v1.ConfigMap, bool, error) {
	if cm, ok := r.configMaps[name]; ok {
		return cm, true, nil
	}
	if r.in.source == nil {
		return nil, false, &errConfig{msg: fmt.Sprintf("couldn't get configMap %s/%s: no apiserver to read it from", r.in.pod.Namespace, name)}
	}
	cm, err := r.in.source.ConfigMap(ctx, r.in.pod, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil, false, nil
		}
		return nil, false, &errConfig{msg: err.Error()}
	}
	r.configMaps[name] = cm
	return cm, true, nil
}

// secret is configMap for Secrets.
func (r *envResolver) secret(ctx context.Context, name string, optional *bool) (*v1.Secret, bool, error) {
	if s, ok := r.secrets[name]; ok {
		return s, true, nil
	}
	if r.in.source == nil {
		return nil, false, &errConfig{msg: fmt.Sprintf("couldn't get secret %s/%s: no apiserver to read it from", r.in.pod.Namespace, name)}
	}
	s, err := r.in.source.Secret(ctx, r.in.pod, name)
	if err != nil {
		if apierrors.IsNotFound(err) && isTrue(optional) {
			return nil, false, nil
		}
		return nil, false, &errConfig{msg: err.Error()}
	}
	r.secrets[name] = s
	return s, true, nil
}

func isTrue(b *bool) bool { return b != nil && *b }

func fieldRefValue(in envInput, envName, path string) (string, error) {
	pod := in.pod
	switch {
	case path == "metadata.name":
		return pod.Name, nil
	case path == "metadata.namespace":
		return pod.Namespace, nil
	case path == "metadata.uid":
		return string(pod.UID), nil
	case path == "spec.nodeName":
		return pod.Spec.NodeName, nil
	case path == "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case path == "status.podIP":
		return first(podAddresses(pod, in.podIPs, in.hostIPs)), nil
	case path == "status.podIPs":
		return strings.Join(podAddresses(pod, in.podIPs, in.hostIPs), ","), nil
	case path == "status.hostIP":
		return first(in.hostIPs), nil
	case path == "status.hostIPs":
		return strings.Join(in.hostIPs, ","), nil
	case strings.HasPrefix(path, "metadata.labels['") && strings.HasSuffix(path, "']"):
		return pod.Labels[path[len("metadata.labels['"):len(path)-2]], nil
	case strings.HasPrefix(path, "metadata.annotations['") && strings.HasSuffix(path, "']"):
		return pod.Annotations[path[len("metadata.annotations['"):len(path)-2]], nil
	}
	return "", &errConfig{msg: fmt.Sprintf("container %q: env %q: unsupported fieldPath %q", in.container.Name, envName, path)}
}

// podAddresses are the pod's IPs as kubelet reports them: a host-network pod has the node's.
func podAddresses(pod *v1.Pod, podIPs, hostIPs []string) []string {
	if pod.Spec.HostNetwork {
		return hostIPs
	}
	return podIPs
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
