package pods

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// errConfig marks a container whose configuration cannot be resolved; its waiting reason is
// CreateContainerConfigError, as kubelet reports it.
type errConfig struct{ msg string }

func (e *errConfig) Error() string { return e.msg }

// containerEnv resolves a container's env in order, expanding $(VAR) references to variables
// defined before, as the API documents. Sources not handled yet are a config error naming the
// variable, never a silently missing variable.
func containerEnv(pod *v1.Pod, c *v1.Container, podIPs, hostIPs []string) ([]string, map[string]string, error) {
	vars := map[string]string{}
	var out []string
	if len(c.EnvFrom) > 0 {
		return nil, nil, &errConfig{fmt.Sprintf("container %q: envFrom is not supported yet", c.Name)}
	}
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil {
			v, err := envValueFrom(pod, c, e, podIPs, hostIPs)
			if err != nil {
				return nil, nil, err
			}
			val = v
		} else {
			val = expand(val, vars)
		}
		vars[e.Name] = val
		out = append(out, e.Name+"="+val)
	}
	return out, vars, nil
}

func envValueFrom(pod *v1.Pod, c *v1.Container, e v1.EnvVar, podIPs, hostIPs []string) (string, error) {
	f := e.ValueFrom.FieldRef
	if f == nil {
		return "", &errConfig{fmt.Sprintf("container %q: env %q: only fieldRef is supported in valueFrom yet", c.Name, e.Name)}
	}
	path := f.FieldPath
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
		return first(podIPs), nil
	case path == "status.podIPs":
		return strings.Join(podIPs, ","), nil
	case path == "status.hostIP":
		return first(hostIPs), nil
	case path == "status.hostIPs":
		return strings.Join(hostIPs, ","), nil
	case strings.HasPrefix(path, "metadata.labels['") && strings.HasSuffix(path, "']"):
		return pod.Labels[path[len("metadata.labels['"):len(path)-2]], nil
	case strings.HasPrefix(path, "metadata.annotations['") && strings.HasSuffix(path, "']"):
		return pod.Annotations[path[len("metadata.annotations['"):len(path)-2]], nil
	}
	return "", &errConfig{fmt.Sprintf("container %q: env %q: unsupported fieldPath %q", c.Name, e.Name, path)}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// expand replaces $(VAR) with the value of VAR when VAR is defined, leaves unknown references
// as written, and turns $$ into $, following the Kubernetes expansion rules.
func expand(in string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(in); i++ {
		if in[i] != '$' || i+1 >= len(in) {
			b.WriteByte(in[i])
			continue
		}
		switch in[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(in[i+2:], ')')
			if end < 0 {
				b.WriteString(in[i:])
				return b.String()
			}
			name := in[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(in[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func expandAll(in []string, vars map[string]string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, vars)
	}
	return out
}
