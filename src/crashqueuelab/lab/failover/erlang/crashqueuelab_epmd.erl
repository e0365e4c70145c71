%% The port mapper module of a node of the lab's RabbitMQ cluster (erl -epmd_module).
%%
%% It is Erlang's own erl_epmd in every call but one: asked for a peer's distribution port,
%% it answers the port of the lab's fault proxy path from this node to that peer, named by
%% the variable CRASHQUEUELAB_DIST_PORT_<peer> (the peer's name before the '@', each '-'
%% written '_'). Every connection this node opens to a peer then goes through the proxy,
%% so that a partition window on those paths cuts the nodes apart for real. A peer the
%% variables do not name (rabbitmqctl's own node) is found through epmd as usual, and the
%% lab's readings never pass the proxy.
-module(crashqueuelab_epmd).
-export([start_link/0, register_node/2, register_node/3, listen_port_please/2,
         port_please/2, port_please/3, names/1, address_please/3]).

start_link() -> erl_epmd:start_link().
register_node(Name, Port) -> erl_epmd:register_node(Name, Port).
register_node(Name, Port, Family) -> erl_epmd:register_node(Name, Port, Family).
listen_port_please(Name, Host) -> erl_epmd:listen_port_please(Name, Host).
names(Host) -> erl_epmd:names(Host).
address_please(Name, Host, Family) -> erl_epmd:address_please(Name, Host, Family).

port_please(Name, Host) -> port_please(Name, Host, infinity).

port_please(Name, Host, Timeout) ->
    Peer = [case C of $- -> $_; _ -> C end || C <- lists:flatten(io_lib:format("~s", [Name]))],
    case os:getenv("CRASHQUEUELAB_DIST_PORT_" ++ Peer) of
        false -> erl_epmd:port_please(Name, Host, Timeout);
        %% 6: the distribution protocol version every OTP release since 23 speaks.
        Port -> {port, list_to_integer(Port), 6}
    end.
