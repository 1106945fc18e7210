# Bash completion for stillpoint: commands, their options, config keys for
# overrides (from `stillpoint config --keys`), YAML files for configs and
# directories for runs. Installed as
# <prefix>/share/bash-completion/completions/stillpoint; to use it from a
# build tree: source training/cli/completion/stillpoint.bash

_stillpoint() {
  local cur prev command
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD-1]}"
  local commands="train eval compare report retrieve bench config generate"
  if [[ ${COMP_CWORD} -eq 1 ]]; then
    COMPREPLY=($(compgen -W "${commands} --help --version" -- "${cur}"))
    return
  fi
  command="${COMP_WORDS[1]}"
  local options
  case "${command}" in
    train) options="--resume --force --overwrite --stop-after --help" ;;
    eval) options="--iters --length --size --until-converged --cap --json --gradient-check --help" ;;
    compare) options="--overwrite --help" ;;
    report) options="--out --overwrite --help" ;;
    retrieve) options="--patterns --queries --out --beta --solver --tol --max-iter --threads --dtype --max-file-mib --overwrite --help" ;;
    bench) options="--model --attention --no-warm-start --iters --threads --shards --steps --warmup --scaling --json --weights --dtype --seed --lengths --depths --models --tokens --depth-length --repeats --out --peer --python --peer-env --in-process --help" ;;
    config) options="--resolved --doc --json-schema --keys --help" ;;
    generate) options="--prompt --tokens --temperature --top-k --seed --keep --full-window --no-warm-start --json --help" ;;
    *) return ;;
  esac
  case "${prev}" in
    --patterns|--queries|--weights|--peer|--python)
      COMPREPLY=($(compgen -f -- "${cur}"))
      return ;;
    --out)
      COMPREPLY=($(compgen -d -- "${cur}"))
      return ;;
  esac
  if [[ "${cur}" == -* ]]; then
    COMPREPLY=($(compgen -W "${options}" -- "${cur}"))
    return
  fi
  case "${command}" in
    train|compare|config)
      if [[ "${cur}" == *.* && "${cur}" != */* && "${cur}" != *.yaml && "${cur}" != *.yml ]] ||
         [[ ${COMP_CWORD} -gt 2 ]]; then
        # An override: complete the key, ending in "=".
        local keys
        keys="$("${COMP_WORDS[0]}" config --keys 2>/dev/null)"
        COMPREPLY=($(compgen -W "${keys}" -S "=" -- "${cur}"))
        compopt -o nospace 2>/dev/null
        [[ ${#COMPREPLY[@]} -gt 0 ]] && return
      fi
      COMPREPLY=($(compgen -f -X '!*.yaml' -- "${cur}") $(compgen -f -X '!*.yml' -- "${cur}")
                 $(compgen -d -- "${cur}"))
      ;;
    eval|report|generate)
      COMPREPLY=($(compgen -d -- "${cur}") $(compgen -f -X '!*.ckpt' -- "${cur}"))
      ;;
  esac
}
complete -F _stillpoint stillpoint
