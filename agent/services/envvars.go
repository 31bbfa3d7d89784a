package services

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// masterService is the service whose variables every pod gets, whatever its namespace and
// enableServiceLinks: in-cluster clients find the apiserver through it.
const masterService = "kubernetes"

// EnvVars returns the service variables of a pod in namespace, as the kubelet's
// getServiceEnvVarMap: the `kubernetes` service of `default` always, and the services of the
// pod's namespace when enableServiceLinks is true. Services without a cluster IP (headless)
// give none.
func EnvVars(services []*v1.Service, namespace string, enableServiceLinks bool) map[string]string {
	chosen := map[string]*v1.Service{}
	for _, s := range services {
		if !hasClusterIP(s) {
			continue
		}
		if s.Namespace == metav1.NamespaceDefault && s.Name == masterService {
			if _, ok := chosen[s.Name]; !ok {
				chosen[s.Name] = s
			}
		} else if s.Namespace == namespace && enableServiceLinks {
			chosen[s.Name] = s
		}
	}
	out := map[string]string{}
	for _, s := range chosen {
		for _, kv := range fromService(s) {
			out[kv[0]] = kv[1]
		}
	}
	return out
}

func hasClusterIP(s *v1.Service) bool {
	return s.Spec.ClusterIP != v1.ClusterIPNone && s.Spec.ClusterIP != "" && len(s.Spec.Ports) > 0
}

// fromService is the kubelet's envvars.FromServices for one service.
func fromService(s *v1.Service) [][2]string {
	prefix := envName(s.Name)
	out := [][2]string{
		{prefix + "_SERVICE_HOST", s.Spec.ClusterIP},
		{prefix + "_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port))},
	}
	for _, sp := range s.Spec.Ports {
		if sp.Name != "" {
			out = append(out, [2]string{prefix + "_SERVICE_PORT_" + envName(sp.Name), strconv.Itoa(int(sp.Port))})
		}
	}
	// Docker-compatible link variables.
	for i, sp := range s.Spec.Ports {
		protocol := string(v1.ProtocolTCP)
		if sp.Protocol != "" {
			protocol = string(sp.Protocol)
		}
		proto := strings.ToLower(protocol)
		url := fmt.Sprintf("%s://%s", proto, net.JoinHostPort(s.Spec.ClusterIP, strconv.Itoa(int(sp.Port))))
		if i == 0 {
			out = append(out, [2]string{prefix + "_PORT", url})
		}
		portPrefix := fmt.Sprintf("%s_PORT_%d_%s", prefix, sp.Port, strings.ToUpper(protocol))
		out = append(out,
			[2]string{portPrefix, url},
			[2]string{portPrefix + "_PROTO", proto},
			[2]string{portPrefix + "_PORT", strconv.Itoa(int(sp.Port))},
			[2]string{portPrefix + "_ADDR", s.Spec.ClusterIP},
		)
	}
	return out
}

func envName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }
